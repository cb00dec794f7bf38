// What the GPU test files of kv-fp8mla share: device buffers and the layout made through the registry (after
// load_plugins(), fp8_test_plugins.h).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "fp8_test_plugins.h"
#include "kiln/kv_layout.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::fp8mla {

inline constexpr int64_t kTestBlock = 16;

inline std::shared_ptr<KvLayout> make_layout(Device device, int64_t latent, int64_t rope, int64_t block = kTestBlock) {
  ModelInfo info;
  info.kv_lora_rank = latent;
  info.qk_rope_head_dim = rope;
  RecipeSection kv("kv");
  kv.set("block_size", block);
  CreateContext ctx;
  ctx.section = &kv;
  ctx.device = device;
  ctx.model = &info;
  auto made = global_registry().create<KvLayout>("fp8_ds_mla", ctx);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? *made : nullptr;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// `keys` rows (latent + rope fp32 each) stored by the host layout on `blocks` pages of `block` slots in shuffled order,
// the other slots holding `fill` bytes: the block table and the page bytes.
struct HostPages {
  std::vector<int32_t> table;
  std::vector<uint8_t> pages;
};
inline HostPages store_on_shuffled_pages(const KvLayout& cpu, const std::vector<float>& rows, int64_t keys,
                                         int64_t blocks, int64_t block, uint8_t fill, std::mt19937& rng) {
  HostPages h;
  h.table.resize(static_cast<size_t>(blocks));
  std::iota(h.table.begin(), h.table.end(), 0);
  std::shuffle(h.table.begin(), h.table.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(keys));
  for (int64_t t = 0; t < keys; ++t) slots[t] = h.table[t / block] * block + t % block;
  h.pages.assign(static_cast<size_t>(blocks * block) * cpu.bytes_per_token(), fill);
  std::vector<float> work = rows;  // append may finish rows in place
  KvAppendArgs a;
  a.slots = slots.data(), a.n = keys, a.rows = work.data(), a.pages = h.pages.data();
  const Status st = cpu.append(a, {});
  EXPECT_TRUE(st.ok()) << st.to_string();
  return h;
}

}  // namespace kiln::fp8mla
