#include "engine/kv_capacity.h"

#include <gtest/gtest.h>

#include <limits>

#include "engine/engine_config.h"

namespace kiln {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(KvCapacity, ReportsTokensAndWindows) {
  KvCapacity c;
  c.num_blocks = 45584;
  c.block_size = 64;
  c.max_model_len = 1048576;
  c.bytes = static_cast<uint64_t>(16.61 * kGiB);
  EXPECT_EQ(c.tokens(), 2917376);
  EXPECT_EQ(c.report(),
            "KV cache: 2,917,376 tokens = 2.78 windows of 1,048,576 (45,584 blocks of 64 tokens, 16.61 GiB)");
}

TEST(KvCapacity, SizesThePoolFromWhatTheWeightsLeave) {
  KvPoolBudget b;
  b.memory_bytes = 100 * kGiB;
  b.utilization = 0.5;
  b.weight_bytes = 10 * kGiB;
  b.workspace_bytes = 2 * kGiB;
  b.bytes_per_token = kv_bytes_per_token(47, 656, 0, IndexerKeyFormat::kFp8E4m3Scaled);  // fp8_ds_mla over 47 layers
  b.block_size = 64;
  b.max_model_len = 131072;
  auto c = plan_kv_capacity(b);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint64_t pool = 38 * kGiB;
  EXPECT_EQ(c->num_blocks, static_cast<int64_t>(pool / (b.bytes_per_token * 64)));
  EXPECT_LE(c->bytes, pool);
  EXPECT_GT(c->bytes, pool - b.bytes_per_token * 64);
  EXPECT_GT(c->windows(), 1.0);
}

// Decode-context parallelism on GPUs: a rank's pool stores its own page of each scheduler block (block / D tokens),
// so the same memory holds D times the blocks, and the pool's bytes are what it stores.
TEST(KvCapacity, ARankStoringItsPageOfEachBlockHoldsMoreBlocks) {
  KvPoolBudget b;
  b.memory_bytes = 64 * kGiB;
  b.utilization = 0.5;
  b.bytes_per_token = 1152 * 47;
  b.block_size = 128;  // kv.block_size 64 × decode_context 2
  b.max_model_len = 4096;
  auto whole = plan_kv_capacity(b);
  b.stored_per_block = 64;
  auto split = plan_kv_capacity(b);
  ASSERT_TRUE(whole.ok() && split.ok());
  EXPECT_EQ(split->num_blocks, static_cast<int64_t>(32 * kGiB / (b.bytes_per_token * 64)));
  EXPECT_GE(split->num_blocks, 2 * whole->num_blocks);
  EXPECT_EQ(split->tokens(), split->num_blocks * 128);
  EXPECT_EQ(split->bytes, static_cast<uint64_t>(split->num_blocks) * b.bytes_per_token * 64);
}

TEST(KvCapacity, CapsAtTheGivenTokenCount) {
  KvPoolBudget b;
  b.memory_bytes = 64 * kGiB;
  b.bytes_per_token = 1000;
  b.block_size = 16;
  b.max_model_len = 100;
  b.max_tokens = 4 * 100;
  auto c = plan_kv_capacity(b);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_blocks, 25);
}

TEST(KvCapacity, RefusesAPoolSmallerThanOneWindow) {
  KvPoolBudget b;
  b.memory_bytes = 10 * kGiB;
  b.utilization = 0.9;
  b.weight_bytes = 9 * kGiB;
  b.bytes_per_token = 1 << 20;
  b.block_size = 64;
  b.max_model_len = 1 << 20;
  auto c = plan_kv_capacity(b);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("1,048,576 tokens"), std::string::npos) << c.status().message();
}

TEST(KvCapacity, BytesPerTokenIncludeTheIndexerKeys) {
  EXPECT_EQ(kv_bytes_per_token(2, 1152, 0, IndexerKeyFormat::kFp32), 2304u);
  EXPECT_EQ(kv_bytes_per_token(2, 1152, 128, IndexerKeyFormat::kFp32), 2u * (1152 + 512));
  // fp8_ds_mla stores the indexer's 128-d key as 128 e4m3 codes and one fp32 scale.
  EXPECT_EQ(kv_bytes_per_token(2, 656, 128, IndexerKeyFormat::kFp8E4m3Scaled), 2u * (656 + 132));
}

TEST(EngineConfig, ReadsTheSchedulerSection) {
  RecipeSection s("scheduler");
  s.set("max_model_len", int64_t{0});
  s.set("max_num_seqs", int64_t{4});
  s.set("max_num_batched_tokens", int64_t{256});
  s.set("prefix_caching", false);
  auto c = engine_config_from_recipe(s, 2048);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->max_model_len, 2048);
  EXPECT_EQ(c->max_num_seqs, 4);
  EXPECT_EQ(c->max_num_batched_tokens, 256);
  EXPECT_FALSE(c->prefix_caching);

  s.set("max_model_len", int64_t{4096}, "configs/x.toml:3");
  c = engine_config_from_recipe(s, 2048);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("scheduler.max_model_len` (configs/x.toml:3)"), std::string::npos)
      << c.status().message();
}

// A checkpoint stating max_position_embeddings past 32-bit positions (hostile or careless) is named, not sized into
// a pool of no blocks.
TEST(EngineConfig, PositionsPast32BitsAreRefusedWithTheirSource) {
  RecipeSection s("scheduler");
  s.set("max_model_len", int64_t{0});
  auto c = engine_config_from_recipe(s, std::numeric_limits<int64_t>::max());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("the model's max_position_embeddings"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("set it lower"), std::string::npos) << c.status().message();
  s.set("max_model_len", int64_t{1} << 32);
  c = engine_config_from_recipe(s, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("4294967296 is beyond"), std::string::npos) << c.status().message();
  s.set("max_model_len", int64_t{1} << 20);
  EXPECT_TRUE(engine_config_from_recipe(s, 0).ok());
}

}  // namespace
}  // namespace kiln
