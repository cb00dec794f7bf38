// The built-in paged MLA KV layouts: each page holds block_size rows of [latent_dim + rope_dim]
// (the normalised latent c first, then the roped k_pe), so slot s is row s of the layer's cache.
// `bf16` stores them as bf16 (the serving default; CPU and CUDA, builtin/cuda/bf16_kv_layout_cuda.cpp for the
// latter); `fp32` stores them exactly (the reference layout the transformers comparisons use; CPU). Geometry comes
// from the model (kv_lora_rank, qk_rope_head_dim) and the recipe key `block_size` (default 64).
#pragma once

#include <memory>
#include <string>

#include "kiln/kv_layout.h"

namespace kiln::builtin {

constexpr int64_t kDefaultKvBlockSize = 64;

Result<std::unique_ptr<KvLayout>> create_bf16_kv_layout(const CreateContext& context);
Result<std::unique_ptr<KvLayout>> create_fp32_kv_layout(const CreateContext& context);
// Defined only in CUDA builds.
Result<std::unique_ptr<KvLayout>> create_bf16_kv_layout_cuda(const CreateContext& context);

// The geometry a layout named `name` gets from the model and its [kv] section.
Result<KvGeometry> kv_geometry(const CreateContext& context, const std::string& name);

}  // namespace kiln::builtin
