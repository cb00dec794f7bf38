// Rank 0's start-up meeting (kiln/tcp_bootstrap.h) gives up at once when a rank that had connected closes its
// connection before the others arrive — it exited — instead of waiting out the timeout; the error names it and
// the ranks still missing.
#include <gtest/gtest.h>

#include <thread>

#include "kiln/tcp_bootstrap.h"
#include "parallel/rendezvous_support.h"

namespace kiln {
namespace {

using namespace std::chrono_literals;

TEST(Rendezvous, ARankThatConnectsAndExitsEndsRankZerosWaitAtOnce) {
  for (int world : {3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const int port = testing::free_port();
    // Rank 1 joins and exits (its connect returns once rank 0 accepted it); the others never come.
    std::thread one([&] { auto b = TcpBootstrap::connect(testing::spec_for(port, 1, world)); });
    const auto t0 = std::chrono::steady_clock::now();
    auto root = TcpBootstrap::connect(testing::spec_for(port, 0, world));  // a 20 s timeout
    const auto took = std::chrono::steady_clock::now() - t0;
    one.join();
    ASSERT_FALSE(root.ok());
    EXPECT_LT(took, 5s);
    const std::string m = root.status().message();
    EXPECT_NE(m.find("rank 1 connected"), std::string::npos) << m;
    EXPECT_NE(m.find("closed its connection"), std::string::npos) << m;
    EXPECT_NE(m.find(world == 3 ? "rank(s) 2 " : "rank(s) 2, 3 "), std::string::npos) << m;
  }
}

// A rank that goes on to its first exchange while rank 0 still waits for others is no rank that exited: the meeting
// completes, and what it sent arrives intact.
TEST(Rendezvous, ARankThatSendsEarlyIsNotTakenForGone) {
  const int port = testing::free_port();
  Status one_status, two_status;
  std::thread one([&] {
    auto b = TcpBootstrap::connect(testing::spec_for(port, 1, 3));
    if (!b.ok()) return void(one_status = b.status());
    one_status = (*b)->send(0, "early");
    if (one_status.ok()) one_status = (*b)->receive(0).status();  // stays until rank 0 answers
  });
  std::thread two([&] {
    std::this_thread::sleep_for(300ms);
    auto b = TcpBootstrap::connect(testing::spec_for(port, 2, 3));
    two_status = b.status();
  });
  auto root = TcpBootstrap::connect(testing::spec_for(port, 0, 3));
  ASSERT_TRUE(root.ok()) << root.status().message();
  auto got = (*root)->receive(1);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, "early");
  EXPECT_TRUE((*root)->send(1, "done").ok());
  one.join();
  two.join();
  EXPECT_TRUE(one_status.ok()) << one_status.message();
  EXPECT_TRUE(two_status.ok()) << two_status.message();
}

}  // namespace
}  // namespace kiln
