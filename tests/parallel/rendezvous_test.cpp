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

}  // namespace
}  // namespace kiln
