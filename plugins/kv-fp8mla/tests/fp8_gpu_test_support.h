// What the GPU test files of kv-fp8mla share: device buffers and the layout made through the registry (after
// load_plugins(), fp8_test_plugins.h).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
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

}  // namespace kiln::fp8mla
