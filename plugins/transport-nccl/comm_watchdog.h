// The `nccl` collective's watchdog: NCCL reports a failed peer or network only through ncclCommGetAsyncError, and a
// peer that hangs not at all — a collective simply never completes, and the rank waiting for its result (a stream
// synchronisation, a token copy) hangs with it. The watchdog turns both into a Status: a thread ticks it every
// `period`; each tick (1) asks the communicator for its asynchronous error and (2) looks at the oldest operation
// still pending (enqueued with begin(), done when its CUDA event has completed). An error, or an operation older than
// transport.timeout_s, aborts the communicator once (ncclCommAbort: its kernels exit, so the waiting rank wakes up)
// and from then on status() says why: every later call of the collective returns it instead of enqueuing.
//
// wait_ready() bounds the host-side waits of a non-blocking communicator (ncclConfig_t blocking = 0): its creation,
// and an enqueue that returned ncclInProgress (NCCL connecting peers lazily), polling the asynchronous state until it
// is no longer in progress, an error, or the timeout.
//
// Nothing here includes NCCL or CUDA: the communicator is behind WatchedComm and time behind the callers' clock, so
// the state machine is tested on the CPU with a fake of each (tests/comm_watchdog_test.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/status.h"

namespace kiln::nccl {

using WatchClock = std::chrono::steady_clock;

// What the watchdog needs of a communicator.
class WatchedComm {
 public:
  enum class Health { kOk, kInProgress, kError };
  virtual ~WatchedComm() = default;
  // ncclCommGetAsyncError: kError fills `error` (NCCL's text).
  virtual Health health(std::string& error) = 0;
  // ncclCommAbort; called at most once, and never again after it.
  virtual void abort() = 0;
};

class CommWatchdog {
 public:
  CommWatchdog(WatchedComm& comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {}

  // An operation enqueued at `now`, named for the error ("ncclAllReduce of 4096 bf16"); `done` says whether it has
  // completed (asked from the watchdog thread), `retire` runs once it has (or when the watchdog drops it).
  void begin(std::string what, WatchClock::time_point now, std::function<bool()> done,
             std::function<void()> retire = {});
  // One check (above). OK while healthy; else why the communicator was aborted.
  Status tick(WatchClock::time_point now);
  // Polls the communicator (ticking) until it is no longer in progress: OK, or the error that aborted it, or an abort
  // once `what` has waited longer than the timeout. `sleep` waits between polls (tests pass a fake clock's).
  Status wait_ready(const std::string& what, const std::function<WatchClock::time_point()>& now,
                    const std::function<void(std::chrono::milliseconds)>& sleep);

  Status status() const;
  bool aborted() const;
  size_t pending() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Op {
    std::string what;
    WatchClock::time_point started;
    std::function<bool()> done;
    std::function<void()> retire;
  };
  // Aborts once (mu_ held).
  Status abort_locked(Status why);
  void retire_all_locked();

  WatchedComm& comm_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::deque<Op> pending_;
  Status status_;
};

// Ticks a watchdog every `period` on a thread of its own until destroyed.
class WatchdogThread {
 public:
  WatchdogThread(CommWatchdog& watchdog, std::chrono::milliseconds period);
  ~WatchdogThread();
  WatchdogThread(const WatchdogThread&) = delete;
  WatchdogThread& operator=(const WatchdogThread&) = delete;

 private:
  CommWatchdog& watchdog_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// "5 s", "1500 ms": a bound as the messages spell it.
std::string bound_text(std::chrono::milliseconds timeout);

}  // namespace kiln::nccl
