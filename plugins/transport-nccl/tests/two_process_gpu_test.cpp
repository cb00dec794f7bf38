// Two processes sharing one GPU (label `gpu`): the custom all-reduce over CUDA IPC (handles work between processes
// on one device), its probe and the fallback. NCCL refuses two ranks on one GPU ("Duplicate GPU detected", NCCL ≥
// 2.5), so the NCCL side of the fallback cannot run here: the tests check that the probe chooses NCCL and says
// why, and that the plugin's NCCL init fails with NCCL's own reason rather than hanging.
#include <gtest/gtest.h>

#include <filesystem>

#include "rank_processes.h"

namespace kiln::nccl {
namespace {
namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("kiln_nccl_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string both(const testing::RankRun& run) {
  std::string s;
  for (size_t r = 0; r < run.logs.size(); ++r) s += "--- rank " + std::to_string(r) + " ---\n" + run.logs[r];
  return s;
}

TEST(TwoProcessesOneGpu, CustomAllReduceGivesTheRankOrderSumWithIdenticalBits) {
  const fs::path dir = scratch("ipc");
  auto run = testing::run_ranks(KILN_NCCL_RANK_HELPER, 2, {"ipc"}, dir, std::chrono::seconds(300));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  EXPECT_NE(run.logs[0].find("0 mismatches"), std::string::npos) << both(run);
  const std::string r0 = testing::read_text(dir / "result0.bin"), r1 = testing::read_text(dir / "result1.bin");
  EXPECT_GT(r0.size(), size_t{16} << 20);
  EXPECT_TRUE(r0 == r1) << "the two ranks' results differ";
}

// The fused MoE sum + combine + residual add + RMSNorm gives what the custom all-reduce followed by the core's
// combine kernel gives, bit for bit, on both ranks alike (the rank helper compares; here both ranks' bytes).
TEST(TwoProcessesOneGpu, FusedMoeSumAndNormGiveTheUnfusedBits) {
  const fs::path dir = scratch("moe");
  auto run = testing::run_ranks(KILN_NCCL_RANK_HELPER, 2, {"moe"}, dir, std::chrono::seconds(300));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  EXPECT_NE(run.logs[0].find("moe: 18 cases, 0 mismatches"), std::string::npos) << both(run);
  const std::string r0 = testing::read_text(dir / "result0.bin"), r1 = testing::read_text(dir / "result1.bin");
  EXPECT_FALSE(r0.empty());
  EXPECT_TRUE(r0 == r1) << "the two ranks' results differ";
}

testing::RankRun probe(const std::string& mode, const std::string& force) {
  return testing::run_ranks(KILN_NCCL_RANK_HELPER, 2, {"probe", mode, force}, scratch("probe_" + mode + "_" + force));
}

TEST(TwoProcessesOneGpu, AutoProbePassesAndChoosesTheCustomAllReduce) {
  auto run = probe("auto", "none");
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs) EXPECT_NE(log.find("choice: custom"), std::string::npos) << both(run);
}

TEST(TwoProcessesOneGpu, ForcedProbeFailureFallsBackToNcclSayingWhy) {
  auto run = probe("auto", "all");
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs) {
    EXPECT_NE(log.find("choice: nccl (rank 0: the probe was made to fail (transport.custom_all_reduce_force_fail"),
              std::string::npos)
        << both(run);
    EXPECT_NE(log.find("custom all-reduce probe failed, all-reduce by NCCL: rank 0: the probe was made to fail"),
              std::string::npos)
        << both(run);
  }
}

// One rank's failure decides for both: no rank may use the custom kernel while another waits in NCCL.
TEST(TwoProcessesOneGpu, OneRanksProbeFailureDecidesForBoth) {
  auto run = probe("auto", "rank1");
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs)
    EXPECT_NE(log.find("choice: nccl (rank 1: the probe was made to fail"), std::string::npos) << both(run);
}

TEST(TwoProcessesOneGpu, OnFailsLoudlyWhenTheProbeFails) {
  auto run = probe("on", "all");
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs)
    EXPECT_NE(log.find("error: transport.custom_all_reduce = on, but the custom all-reduce probe failed: rank 0: the "
                       "probe was made to fail"),
              std::string::npos)
        << both(run);
}

TEST(TwoProcessesOneGpu, OffChoosesNcclWithoutProbing) {
  auto run = probe("off", "all");  // the forced failure is never reached
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs)
    EXPECT_NE(log.find("choice: nccl (transport.custom_all_reduce = off)"), std::string::npos) << both(run);
}

TEST(TwoProcessesOneGpu, NcclRefusesTwoRanksOnOneGpuWithItsReason) {
  if (!fs::exists(KILN_NCCL_PLUGIN_FILE)) GTEST_SKIP() << "transport-nccl was not built (no NCCL)";
  auto run = testing::run_ranks(KILN_NCCL_RANK_HELPER, 2, {"collective"}, scratch("collective"));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << both(run);
  for (const auto& log : run.logs) {
    EXPECT_NE(log.find("create: "), std::string::npos) << both(run);
    EXPECT_EQ(log.find("create: ok"), std::string::npos) << "NCCL accepted two ranks on one GPU:\n" << both(run);
    // ncclCommInitRankConfig since the communicator is non-blocking: the message names the call and NCCL's reason.
    EXPECT_NE(log.find("ncclCommInitRankConfig (rank "), std::string::npos) << both(run);
    EXPECT_NE(log.find("Duplicate GPU detected"), std::string::npos) << both(run);
  }
}

}  // namespace
}  // namespace kiln::nccl
