// How far a model step is batch-invariant: up to `rows` rows in one step (every token of every sequence it
// carries) and `logit_rows` rows whose logits it computes, a decode-shaped row's results (its KV entry, hidden
// state, logits) are bitwise the same whatever other rows share the step. Speculative decoding is lossless only
// inside it: a verification pass of 1 + K rows must reproduce what K + 1 plain decode steps compute, so the engine
// keeps every pass that verifies drafts within the bound (engine/draft_depth.h). The CPU model holds at any size;
// the CUDA runner up to kBatchInvariantMaxRows rows and its lm_head's bound (runtime/cuda/cuda_model_step.h).
//
// A row is decode-shaped when its sequence brings at most `chunk_rows` tokens to the step (a decode, a verification
// pass, or a short prompt chunk): a longer prompt chunk takes the runner's prefill path (on the GPU the expanded-form
// MLA prefill kernel, KDA's chunked scan), whose arithmetic follows the chunk, so a verification pass must keep to
// chunk_rows too. Under scheduler.batch_invariant the engine holds every step inside the whole bound, prompt chunks
// included, and a sequence's output then depends on nothing but its own tokens (not on batching, chunking or the
// prefix cache).
#pragma once

#include <cstdlib>

#include <cstdint>
#include <limits>

namespace kiln {

struct BatchInvariance {
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  int64_t rows = kUnbounded;
  int64_t logit_rows = kUnbounded;
  int64_t chunk_rows = kUnbounded;
  bool bounded() const { return rows != kUnbounded || logit_rows != kUnbounded || chunk_rows != kUnbounded; }
};

// The most rows the CUDA runner's steps are batch-invariant for, whatever the weights (runtime/cuda/cuda_model_step.h's
// kBatchInvariantMaxRows; a weight format may promise fewer): what `kiln recipe check` can know before loading.
inline constexpr int64_t kCudaBatchInvariantMaxRows = 32;

// A sequence bringing at least this many tokens in a step attends in expanded form on the CUDA runner (its MLA
// prefill kernel; DSA models excepted), fewer in absorbed form through the decode kernels; the CPU model in bf16
// precision follows the same rule. 33: a step's whole 32-row bound can be one prompt chunk of the decode path, and
// by FLOPs the absorbed form is the cheaper one below ~350 new tokens anyway (expanding a cached key through kv_b
// costs about what ~350 queries attending to it in latent space do).
inline constexpr int64_t kExpandedPrefillMinTokens = 33;

// Layer-major prefill: the CUDA runner runs a step that is one prompt's chunk of more than this many tokens layer by
// layer in tiles of this many rows (runtime/cuda/cuda_mla_moe_model.h), so its step buffers are one tile's but for the
// rows' token arrays, residual stream and block inputs, and each cached key is expanded through kv_b once per layer.
// 8192: the scheduler-style chunk the prefill benchmarks have run at (a 32K prompt at 66-68 % of the cuBLAS rate in
// 8K chunks, 69 % in 16K ones, which needed twice the step buffers); tiles of other sizes are not measured yet.
inline constexpr int64_t kCudaPrefillTileRows = 8192;

// kCudaPrefillTileRows, or the environment's KILN_PREFILL_TILE (rows; 0 turns the tiling off): an A/B switch the
// runner and the memory model read alike.
inline int64_t cuda_prefill_tile_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("KILN_PREFILL_TILE");
    if (!v || !*v) return kCudaPrefillTileRows;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return *end == '\0' && n >= 0 ? static_cast<int64_t>(n) : kCudaPrefillTileRows;
  }();
  return rows;
}

// The tile the runner uses for KV blocks of block_size tokens: whole blocks (a tile's first key gathers from a block
// boundary), none when the tile is smaller than a block. The memory model prices this one, not the raw setting.
inline int64_t effective_prefill_tile_rows(int64_t tile, int64_t block_size) {
  return block_size > 0 && tile >= block_size ? tile / block_size * block_size : 0;
}

// The longest prompt chunk the CUDA runner computes on the decode path: chunk_rows of its bound.
inline constexpr int64_t kCudaBatchInvariantChunkRows =
    kExpandedPrefillMinTokens - 1 < kCudaBatchInvariantMaxRows ? kExpandedPrefillMinTokens - 1 : kCudaBatchInvariantMaxRows;

}  // namespace kiln
