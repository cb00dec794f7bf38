// glm5_next's CPU weights priced per tensor-parallel rank (glm5_next_cpu_weight_bytes with CpuRanks) against what the
// loaded ranks actually hold: the fp32 copies each rank makes (replicated tensors whole, the per-head ones and kv_b in
// parts), summed over the ranks of one process (threads) or the largest rank's alone (one process per rank).
#include <gtest/gtest.h>

#include <filesystem>

#include "common/reference_fixture.h"
#include "engine/glm5_next_memory.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm5_next/glm5_next_cpu_instance.h"
#include "model/arch/glm5_next/glm5_next_tensor_names.h"
#include "model/arch/glm5_next/glm5_next_weight_inventory.h"
#include "model/model_loader.h"
#include "model/tensor_parallel_instance.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln {
namespace {

using testing::model_dir;

// Bytes of the fp32 copies a loaded CPU model holds (what the mapping does not serve).
uint64_t fp32_copy_bytes(const glm5_next::Glm5NextWeights& w) {
  uint64_t n = w.final_norm.size();
  for (const glm5_next::LayerWeights& l : w.layers) {
    n += l.input_norm.size() + l.post_attention_norm.size();
    for (const glm5_next::MhcWeights* m : {&l.attn_hc, &l.ffn_hc}) n += m->fn.size() + m->base.size() + m->scale.size();
    if (l.kda) n += l.kda->conv.size() + l.kda->dt_bias.size() + l.kda->a_log.size() + l.kda->o_norm.size();
    if (l.dsa) {
      n += l.dsa->q_a_norm.size() + l.dsa->kv_a_norm.size() + l.dsa->kv_b_f32.size();
      if (const auto* x = l.dsa->indexer.get())
        n += x->k_norm_weight.size() + x->k_norm_bias.size() + x->ape.size() + x->compress_gate.size();
    }
    if (l.is_moe) n += l.moe.router.size() + l.moe.router_bias.size();
  }
  return 4 * n;
}

TEST(Glm5NextTensorParallelMemory, CpuCopiesArePricedPerRank) {
  for (const auto& [fixture, world] : {std::pair<std::string, int>{"glm5_next-tiny", 2}, {"glm5_next-h3", 2},
                                       {"glm5_next-h3", 3}, {"glm5_next-shared", 2}}) {
    SCOPED_TRACE(fixture + " over " + std::to_string(world) + " ranks");
    auto recipe = load_recipe("",
                              {"model.path=" + model_dir(fixture).string(), "model.device=cpu", "kv.layout=fp32",
                               "kv.block_size=16", "parallel.tensor=" + std::to_string(world)},
                              global_registry());
    ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
    auto m = load_model(*recipe, global_registry(), {});
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto* group = dynamic_cast<TensorParallelInstance*>(m->model.get());
    ASSERT_NE(group, nullptr);
    uint64_t all = 0, largest = 0;
    for (int r = 0; r < world; ++r) {
      auto* rank = dynamic_cast<glm5_next::Glm5NextCpuInstance*>(&group->rank(r));
      ASSERT_NE(rank, nullptr);
      const uint64_t mine = fp32_copy_bytes(rank->model().weights());
      all += mine;
      largest = std::max(largest, mine);
    }
    const glm5_next::Glm5NextConfig& c = dynamic_cast<const arch::Glm5NextArchitecture&>(*m->arch).config();
    uint64_t files = 0;
    for (const auto& file : m->checkpoint->files()) files += std::filesystem::file_size(file);
    const glm5_next::Glm5NextTensorNames names(*m->checkpoint);
    uint64_t blocks = 0;  // allocations per rank: each copy at most a page of allocator slack
    for (const auto& it : glm5_next::glm5_next_weight_inventory(c, names.trunk_prefix(), false).items)
      blocks += static_cast<uint64_t>(it.count);
    const WeightBytes one = glm5_next_cpu_weight_bytes(c, names, names.trunk_prefix(), files, false, false);
    const WeightBytes threads =
        glm5_next_cpu_weight_bytes(c, names, names.trunk_prefix(), files, false, false, {world, world});
    const WeightBytes process =
        glm5_next_cpu_weight_bytes(c, names, names.trunk_prefix(), files, false, false, {world, 1});
    EXPECT_EQ(threads.low, files);
    EXPECT_EQ(process.low, files);
    EXPECT_GE(threads.high - files, all) << threads.basis;
    EXPECT_LE(threads.high - files - all, 4096 * blocks * world) << threads.basis;
    EXPECT_GE(process.high - files, largest) << process.basis;
    EXPECT_LE(process.high - files - largest, 4096 * blocks) << process.basis;
    // Replicated copies cost once per rank: the ranks together hold more than one model, one rank less.
    EXPECT_GT(threads.high, one.high);
    EXPECT_LT(process.high, one.high + 4096 * blocks);
    EXPECT_NE(threads.basis.find("of " + std::to_string(world) + " tensor-parallel ranks"), std::string::npos)
        << threads.basis;
  }
}

}  // namespace
}  // namespace kiln
