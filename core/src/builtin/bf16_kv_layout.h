// The built-in `bf16` KV layout: each page holds block_size rows of bf16 [latent_dim + rope_dim]
// (the normalised latent c first, then the roped k_pe), so slot s is row s of the layer's cache.
// Geometry comes from the model (kv_lora_rank, qk_rope_head_dim) and the recipe key `block_size`
// (default 64). CPU only for now.
#pragma once

#include <memory>

#include "kiln/kv_layout.h"

namespace kiln::builtin {

constexpr int64_t kDefaultKvBlockSize = 64;

Result<std::unique_ptr<KvLayout>> create_bf16_kv_layout(const CreateContext& context);

}  // namespace kiln::builtin
