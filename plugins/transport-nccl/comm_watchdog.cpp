#include "comm_watchdog.h"

#include <algorithm>

namespace kiln::nccl {

std::string bound_text(std::chrono::milliseconds timeout) {
  const auto ms = timeout.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

void CommWatchdog::begin(std::string what, WatchClock::time_point now, std::function<bool()> done,
                         std::function<void()> retire) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) {  // aborted: nothing will complete it, and nothing waits for it
    if (retire) retire();
    return;
  }
  pending_.push_back({std::move(what), now, std::move(done), std::move(retire)});
}

void CommWatchdog::retire_all_locked() {
  for (Op& op : pending_)
    if (op.retire) op.retire();
  pending_.clear();
}

Status CommWatchdog::abort_locked(Status why) {
  if (!status_.ok()) return status_;
  status_ = std::move(why);
  comm_.abort();
  retire_all_locked();
  return status_;
}

Status CommWatchdog::tick(WatchClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  std::string error;
  if (comm_.health(error) == WatchedComm::Health::kError)
    return abort_locked(unavailable("collective nccl: the communicator failed (" + error +
                                    "); aborted it (ncclCommAbort), the tensor-parallel group cannot go on"));
  while (!pending_.empty()) {
    Op& oldest = pending_.front();
    if (oldest.done()) {
      if (oldest.retire) oldest.retire();
      pending_.pop_front();
      continue;
    }
    if (now - oldest.started > timeout_)
      return abort_locked(unavailable("collective nccl: " + oldest.what + " did not complete within transport.timeout_s = " +
                                      bound_text(timeout_) +
                                      " (a rank hung or is far slower than the others); aborted the communicator "
                                      "(ncclCommAbort), the tensor-parallel group cannot go on"));
    break;  // later operations were enqueued later on the same stream
  }
  return ok_status();
}

Status CommWatchdog::wait_ready(const std::string& what, const std::function<WatchClock::time_point()>& now,
                                const std::function<void(std::chrono::milliseconds)>& sleep) {
  const WatchClock::time_point started = now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status_.ok()) return status_;
      std::string error;
      switch (comm_.health(error)) {
        case WatchedComm::Health::kOk:
          return ok_status();
        case WatchedComm::Health::kError:
          return abort_locked(unavailable("collective nccl: " + what + " failed (" + error +
                                          "); aborted the communicator (ncclCommAbort)"));
        case WatchedComm::Health::kInProgress:
          break;
      }
      if (now() - started > timeout_)
        return abort_locked(unavailable("collective nccl: " + what + " did not complete within transport.timeout_s = " +
                                        bound_text(timeout_) +
                                        " (a rank did not arrive, or hung); aborted the communicator (ncclCommAbort)"));
    }
    sleep(std::chrono::milliseconds(std::min<int64_t>(10, std::max<int64_t>(1, timeout_.count() / 100))));
  }
}

Status CommWatchdog::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool CommWatchdog::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !status_.ok();
}

size_t CommWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

WatchdogThread::WatchdogThread(CommWatchdog& watchdog, std::chrono::milliseconds period)
    : watchdog_(watchdog), period_(period) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      wake_.wait_for(lock, period_, [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      (void)watchdog_.tick(WatchClock::now());
      lock.lock();
    }
  });
}

WatchdogThread::~WatchdogThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace kiln::nccl
