// The TCP bootstrap: ranks as threads and as processes find each other and exchange blobs in rank order; a rank
// that never comes, a wrong world size, a duplicate rank and an occupied port end in errors naming the address.
#include "kiln/tcp_bootstrap.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "free_port.h"

namespace kiln::nccl {
namespace {

using namespace std::chrono_literals;

RendezvousSpec spec(int port, int rank, int world, std::chrono::milliseconds timeout = 20s) {
  RendezvousSpec s;
  s.addr = "127.0.0.1";
  s.port = port;
  s.rank = rank;
  s.world_size = world;
  s.timeout = timeout;
  return s;
}

// What one rank does in the exchange tests: gather its name, broadcast from rank 0, a barrier, gather again.
std::string run_rank(int port, int rank, int world) {
  auto b = TcpBootstrap::connect(spec(port, rank, world));
  if (!b.ok()) return "connect: " + b.status().to_string();
  auto all = (*b)->all_gather("rank" + std::to_string(rank) + std::string(rank * 1000, 'x'));
  if (!all.ok()) return "all_gather: " + all.status().to_string();
  if (static_cast<int>(all->size()) != world) return "all_gather size";
  for (int r = 0; r < world; ++r)
    if ((*all)[r] != "rank" + std::to_string(r) + std::string(r * 1000, 'x'))
      return "all_gather order at " + std::to_string(r);
  auto id = (*b)->broadcast(rank == 0 ? std::string("\0unique\xff", 8) : std::string("ignored"));
  if (!id.ok() || *id != std::string("\0unique\xff", 8)) return "broadcast";
  if (!(*b)->barrier().ok()) return "barrier";
  auto again = (*b)->all_gather(std::string(1, static_cast<char>('a' + rank)));
  if (!again.ok() || (*again)[world - 1] != std::string(1, static_cast<char>('a' + world - 1))) return "second gather";
  return "ok";
}

TEST(TcpBootstrap, OneRankNeedsNoSocket) {
  auto b = TcpBootstrap::connect(spec(0, 0, 1));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto all = (*b)->all_gather("x");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
}

TEST(TcpBootstrap, ThreadsExchangeInRankOrder) {
  for (int world : {2, 3}) {
    const int port = testing::free_loopback_port();
    std::vector<std::string> results(world);
    std::vector<std::thread> ranks;
    // The last rank first: the others retry until rank 0 listens.
    for (int r = world - 1; r >= 0; --r) ranks.emplace_back([&, r] { results[r] = run_rank(port, r, world); });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) EXPECT_EQ(results[r], "ok") << "world " << world << " rank " << r;
  }
}

TEST(TcpBootstrap, ProcessesExchangeInRankOrder) {
  const int port = testing::free_loopback_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(run_rank(port, 1, 2) == "ok" ? 0 : 1);
  EXPECT_EQ(run_rank(port, 0, 2), "ok");
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 (child process) failed";
}

TEST(TcpBootstrap, RankWithoutRankZeroTimesOutNamingTheAddress) {
  const int port = testing::free_loopback_port();
  const auto start = std::chrono::steady_clock::now();
  auto b = TcpBootstrap::connect(spec(port, 1, 2, 600ms));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("rank 1 could not reach rank 0 at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("MASTER_ADDR"), std::string::npos);
  EXPECT_GE(took, 550ms);
  EXPECT_LT(took, 5s);
}

TEST(TcpBootstrap, RankZeroTimesOutNamingTheMissingRanks) {
  const int port = testing::free_loopback_port();
  std::thread one([&] { (void)run_rank(port, 1, 3); });  // rank 2 never comes
  auto b = TcpBootstrap::connect(spec(port, 0, 3, 800ms));
  one.join();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("at 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("for rank(s) 2 to connect"), std::string::npos) << b.status().message();
}

TEST(TcpBootstrap, WorldSizeMismatchIsRefusedOnBothSides) {
  const int port = testing::free_loopback_port();
  Status peer;
  std::thread one([&] { peer = TcpBootstrap::connect(spec(port, 1, 3, 3s)).status(); });
  auto b = TcpBootstrap::connect(spec(port, 0, 2, 3s));
  one.join();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("WORLD_SIZE=3, rank 0 has WORLD_SIZE=2"), std::string::npos)
      << b.status().message();
  ASSERT_FALSE(peer.ok());
  EXPECT_NE(peer.message().find("refused rank 1"), std::string::npos) << peer.message();
}

TEST(TcpBootstrap, DuplicateRankIsRefused) {
  const int port = testing::free_loopback_port();
  // Each claimant keeps its connection until the end (one that closed it would be a rank that exited, which rank 0
  // reports as such).
  std::unique_ptr<TcpBootstrap> kept[2];
  auto claim = [&](int i) {
    auto b = TcpBootstrap::connect(spec(port, 1, 3, 3s));
    if (b.ok()) kept[i] = std::move(b).value();
  };
  std::thread a([&] { claim(0); });
  std::thread b([&] { claim(1); });
  auto root = TcpBootstrap::connect(spec(port, 0, 3, 3s));
  a.join();
  b.join();
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.status().message().find("claim RANK=1"), std::string::npos) << root.status().message();
}

TEST(TcpBootstrap, OccupiedPortIsNamed) {
  const int port = testing::free_loopback_port();
  std::string first_result;
  // Rank 0 of one group holds the port while a second rank 0 tries it.
  std::thread holder([&] { first_result = TcpBootstrap::connect(spec(port, 0, 2, 1500ms)).status().to_string(); });
  std::this_thread::sleep_for(300ms);
  auto b = TcpBootstrap::connect(spec(port, 0, 2, 500ms));
  holder.join();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("rank 0 cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << b.status().message();
}

TEST(TcpBootstrap, PeerThatExitsMidExchangeIsReported) {
  const int port = testing::free_loopback_port();
  std::thread one([&] {
    auto b = TcpBootstrap::connect(spec(port, 1, 2, 3s));
    // Leaves without taking part in the gather: its socket closes.
  });
  auto root = TcpBootstrap::connect(spec(port, 0, 2, 3s));
  one.join();
  ASSERT_TRUE(root.ok()) << root.status().to_string();
  auto all = (*root)->all_gather("x");
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("rank 1 closed the connection"), std::string::npos) << all.status().message();
}

}  // namespace
}  // namespace kiln::nccl
