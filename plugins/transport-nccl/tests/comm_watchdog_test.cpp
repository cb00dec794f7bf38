// The `nccl` collective's watchdog (comm_watchdog.h) with a fake communicator and a fake clock: an asynchronous
// error aborts the communicator once and names NCCL's text; an operation pending past transport.timeout_s aborts it
// naming the operation; completed operations retire in order and a healthy group is never aborted; wait_ready (the
// non-blocking creation, an enqueue in progress) returns when the communicator is ready and aborts at the bound;
// after an abort every call reports the reason and nothing touches the communicator again.
#include "comm_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>

namespace kiln::nccl {
namespace {

using namespace std::chrono_literals;

struct FakeComm final : WatchedComm {
  Health state = Health::kOk;
  std::string error_text;
  int aborts = 0;
  int polls_after_abort = 0;
  Health health(std::string& error) override {
    if (aborts) ++polls_after_abort;
    if (state == Health::kError) error = error_text;
    return state;
  }
  void abort() override { ++aborts; }
};

struct FakeClock {
  WatchClock::time_point t{};
  WatchClock::time_point now() const { return t; }
  void advance(std::chrono::milliseconds d) { t += d; }
};

TEST(CommWatchdog, HealthyOperationsRetireInOrderAndNeverAbort) {
  FakeComm comm;
  FakeClock clock;
  CommWatchdog w(comm, 5s);
  std::vector<bool> done(3, false);
  std::vector<int> retired;
  for (int i = 0; i < 3; ++i) {
    w.begin("op " + std::to_string(i), clock.now(), [&, i] { return done[i]; }, [&, i] { retired.push_back(i); });
    clock.advance(1s);
  }
  EXPECT_EQ(w.pending(), 3u);
  EXPECT_TRUE(w.tick(clock.now()).ok());
  done[1] = true;  // a later one done first: the oldest still holds the queue
  EXPECT_TRUE(w.tick(clock.now()).ok());
  EXPECT_EQ(w.pending(), 3u);
  done[0] = true;
  EXPECT_TRUE(w.tick(clock.now()).ok());
  EXPECT_EQ(w.pending(), 1u);
  EXPECT_EQ(retired, (std::vector<int>{0, 1}));
  clock.advance(4s);  // op 2 started at 2 s: 5 s old now, not over the bound
  EXPECT_TRUE(w.tick(clock.now()).ok());
  done[2] = true;
  clock.advance(100s);
  EXPECT_TRUE(w.tick(clock.now()).ok());
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_EQ(comm.aborts, 0);
  EXPECT_FALSE(w.aborted());
}

TEST(CommWatchdog, AnOperationPastTheBoundAbortsOnceNamingIt) {
  FakeComm comm;
  FakeClock clock;
  CommWatchdog w(comm, 1500ms);
  int retired = 0;
  w.begin("ncclAllReduce of 4096 bf16", clock.now(), [] { return false; }, [&] { ++retired; });
  w.begin("ncclAllGather of 64 f32", clock.now() + 10ms, [] { return false; }, [&] { ++retired; });
  clock.advance(1500ms);
  EXPECT_TRUE(w.tick(clock.now()).ok());  // exactly the bound: not over it
  clock.advance(1ms);
  const Status s = w.tick(clock.now());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("ncclAllReduce of 4096 bf16 did not complete within transport.timeout_s = 1500 ms"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("ncclCommAbort"), std::string::npos);
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_EQ(retired, 2);  // everything pending is dropped (its events reused)
  EXPECT_EQ(w.pending(), 0u);
  // From now on: the same reason, no second abort, the communicator left alone.
  clock.advance(10s);
  EXPECT_EQ(w.tick(clock.now()).message(), s.message());
  EXPECT_EQ(w.status().message(), s.message());
  int late = 0;
  w.begin("ncclBroadcast of 1 i32", clock.now(), [] { return false; }, [&] { ++late; });
  EXPECT_EQ(late, 1);  // retired at once: nothing will complete it
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_EQ(comm.polls_after_abort, 0);
}

TEST(CommWatchdog, AnAsynchronousErrorAbortsAtOnce) {
  FakeComm comm;
  FakeClock clock;
  CommWatchdog w(comm, 300s);
  w.begin("ncclAllReduce of 8 f32", clock.now(), [] { return false; });
  EXPECT_TRUE(w.tick(clock.now()).ok());
  comm.state = WatchedComm::Health::kInProgress;  // in progress is no error
  EXPECT_TRUE(w.tick(clock.now()).ok());
  comm.state = WatchedComm::Health::kError;
  comm.error_text = "remote process exited or there was a network error";
  const Status s = w.tick(clock.now() + 1ms);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("remote process exited or there was a network error"), std::string::npos) << s.message();
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_TRUE(w.aborted());
}

TEST(CommWatchdog, WaitReadyReturnsWhenReadyAndAbortsAtTheBound) {
  for (int ready_after : {0, 3, 40}) {
    FakeComm comm;
    FakeClock clock;
    CommWatchdog w(comm, 1s);
    comm.state = ready_after ? WatchedComm::Health::kInProgress : WatchedComm::Health::kOk;
    int sleeps = 0;
    const Status s = w.wait_ready(
        "ncclCommInitRankConfig (rank 0 of 2 on cuda:0)", [&] { return clock.now(); },
        [&](std::chrono::milliseconds d) {
          EXPECT_GT(d.count(), 0);
          clock.advance(100ms);  // each poll a tenth of the bound later
          if (++sleeps >= ready_after) comm.state = WatchedComm::Health::kOk;
        });
    if (ready_after <= 10) {
      EXPECT_TRUE(s.ok()) << ready_after << ": " << s.to_string();
      EXPECT_EQ(comm.aborts, 0);
    } else {
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("ncclCommInitRankConfig (rank 0 of 2 on cuda:0) did not complete within "
                                 "transport.timeout_s = 1 s"),
                std::string::npos)
          << s.message();
      EXPECT_EQ(comm.aborts, 1);
      EXPECT_LE(sleeps, 11);
    }
  }
  // An error while in progress: aborted, NCCL's text in the message.
  FakeComm comm;
  comm.state = WatchedComm::Health::kError;
  comm.error_text = "invalid usage";
  CommWatchdog w(comm, 1s);
  const Status s = w.wait_ready("ncclAllReduce of 4 f32", [] { return WatchClock::now(); }, [](auto) {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ncclAllReduce of 4 f32 failed (invalid usage)"), std::string::npos) << s.message();
  EXPECT_EQ(comm.aborts, 1);
}

TEST(CommWatchdog, TheThreadAbortsAHungOperationInRealTime) {
  FakeComm comm;
  CommWatchdog w(comm, 200ms);
  std::atomic<bool> done{false};
  {
    WatchdogThread thread(w, 10ms);
    w.begin("completes", WatchClock::now(), [&] { return done.load(); });
    std::this_thread::sleep_for(50ms);
    done = true;
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(w.aborted());  // it completed within the bound
    const auto t0 = WatchClock::now();
    w.begin("hangs", t0, [] { return false; });
    while (!w.aborted() && WatchClock::now() - t0 < 5s) std::this_thread::sleep_for(5ms);
    EXPECT_TRUE(w.aborted());
    EXPECT_LT(WatchClock::now() - t0, 1s);
  }
  EXPECT_NE(w.status().message().find("hangs did not complete"), std::string::npos) << w.status().to_string();
  EXPECT_EQ(comm.aborts, 1);
}

}  // namespace
}  // namespace kiln::nccl
