// How many KV tokens the pool holds, decided once at start from the memory left after the weights.
//
// CUDA: pool = gpu_memory_utilization × device memory − weights − workspace.
// CPU:  the same formula over physical RAM, capped at max_num_seqs × max_model_len tokens — on the CPU the pool
//       is ordinary heap memory and every byte of it is touched at start, so it is sized for the sequences that
//       can actually run rather than for most of the machine's RAM.
// The pool must hold at least one max_model_len window, or a request the limits allow could never run.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/indexer_key_format.h"
#include "kiln/status.h"

namespace kiln {

struct KvPoolBudget {
  uint64_t memory_bytes = 0;  // device memory (CUDA) or physical RAM (CPU)
  double utilization = 0.9;   // scheduler.gpu_memory_utilization
  uint64_t weight_bytes = 0;
  uint64_t workspace_bytes = 0;  // activations, logits, scratch of the largest step
  uint64_t bytes_per_token = 0;  // KV of one token over all layers (kv_bytes_per_token)
  int64_t block_size = 0;
  int64_t max_model_len = 0;
  int64_t max_tokens = 0;  // cap (the CPU rule above); 0 = none
  int64_t stored_per_block = 0;  // tokens of a block this pool stores (stored_block_size); 0 = block_size
};

struct KvCapacity {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t max_model_len = 0;
  uint64_t bytes = 0;  // the pool
  // Per-sequence state slots (recurrent layers) with their snapshots, for max_num_seqs sequences; 0 without.
  uint64_t state_bytes = 0;
  int64_t max_num_seqs = 0;

  int64_t tokens() const { return num_blocks * block_size; }
  // Complete max_model_len windows the pool holds (fractional): how many full-length sequences fit at once.
  double windows() const { return static_cast<double>(tokens()) / static_cast<double>(max_model_len); }
  // "KV cache: 2,917,376 tokens = 2.78 windows of 1,048,576 (45,584 blocks of 64 tokens, 16.61 GiB)"
  std::string report() const;
};

// KV bytes of one token over every layer that caches: the layout's bytes per token plus, for DSA models (every
// layer running its own indexer), the indexer's key in the layout's format (kiln/indexer_key_format.h).
uint64_t kv_bytes_per_token(int64_t num_layers, uint64_t layout_bytes_per_token, int64_t index_head_dim,
                            IndexerKeyFormat index_keys);

Result<KvCapacity> plan_kv_capacity(const KvPoolBudget& budget);

// Physical RAM of this machine, for KvPoolBudget::memory_bytes on the CPU.
uint64_t physical_memory_bytes();

}  // namespace kiln
