// The launch environment: torchrun's variables parsed, defaults for one rank, and every mistake named.
#include "kiln/launch_env.h"

#include <gtest/gtest.h>

#include <map>

namespace kiln::nccl {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnv, NoVariablesMeansOneRank) {
  auto e = read_launch_env(env_of({}));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->rank, 0);
  EXPECT_EQ(e->world_size, 1);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->master_port, 0);
}

TEST(LaunchEnv, ReadsTorchrunVariables) {
  auto e = read_launch_env(env_of({{"RANK", "3"},
                                   {"WORLD_SIZE", "4"},
                                   {"LOCAL_RANK", "1"},
                                   {"MASTER_ADDR", "node0.example"},
                                   {"MASTER_PORT", "29500"},
                                   {"KILN_RENDEZVOUS_TIMEOUT_S", "7"}}));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node0.example");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->rendezvous_timeout, std::chrono::seconds(7));
}

TEST(LaunchEnv, DefaultsLocalRankToRankAndAddressToLoopback) {
  auto e = read_launch_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}}));
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "127.0.0.1");
}

void expect_error(std::map<std::string, std::string> vars, const std::string& needle) {
  auto e = read_launch_env(env_of(vars));
  ASSERT_FALSE(e.ok()) << "accepted; expected an error containing: " << needle;
  EXPECT_NE(e.status().message().find(needle), std::string::npos) << e.status().message();
}

TEST(LaunchEnv, NamesEveryMistake) {
  expect_error({{"WORLD_SIZE", "two"}}, "WORLD_SIZE=\"two\" is not an integer");
  expect_error({{"WORLD_SIZE", "2x"}, {"MASTER_PORT", "1"}}, "WORLD_SIZE=\"2x\"");
  expect_error({{"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is outside");
  expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "RANK=2 but WORLD_SIZE=2");
  expect_error({{"RANK", "-1"}}, "RANK=-1 is outside");
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, "needs MASTER_PORT");
  expect_error({{"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is outside [1, 65535]");
  expect_error({{"MASTER_ADDR", ""}}, "MASTER_ADDR is set but empty");
  expect_error({{"KILN_RENDEZVOUS_TIMEOUT_S", "0"}}, "KILN_RENDEZVOUS_TIMEOUT_S=0 is outside");
}

}  // namespace
}  // namespace kiln::nccl
