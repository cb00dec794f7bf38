// MlaMoeModel under decode-context parallelism: the pieces of attention and of the DSA indexer that read the KV cache
// split by token over a group of D ranks (decode_context_shard.h for the addressing, mla_moe_model.h for the design).
// Every function here is a meeting of the group: its ranks call it together for the same sequences in the same order.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/dsa_indexer.h"
#include "model/mla_moe_model.h"
#include "model/split_context_attention.h"

namespace kiln {
namespace {

const Stream kHost{Device::cpu(), nullptr};

}  // namespace

SplitContext MlaMoeModel::split_context() const { return {context_group_, context_shard_, weights_.shard}; }

Status MlaMoeModel::context_rows(const SequenceStep& st, int64_t ctx, const void* pages, const KvLayout& layout,
                                 float* rows) const {
  return gather_split_rows(split_context(), ctx, config_.kv_lora_rank + config_.qk_rope_head_dim,
                           [&](int64_t, float* own) { return own_latent_rows(context_shard_, st, ctx, pages, layout, own); },
                           rows);
}

Status MlaMoeModel::context_attend(const SequenceStep& st, int64_t n, const float* qa, const int32_t* selected,
                                   int64_t selected_width, float scale, const void* pages, const KvLayout& layout,
                                   float* o_lat) const {
  return attend_split_context(split_context(), config_.num_attention_heads, config_.kv_lora_rank,
                              config_.qk_rope_head_dim, st, n, qa, selected, selected_width, scale, pages, layout,
                              o_lat);
}

Status MlaMoeModel::context_index_scores(const SequenceStep& st, int64_t n, const float* q, const float* w,
                                         const uint8_t* key_cache, IndexerKeyFormat key_format, int64_t page,
                                         float scale, float* scores) const {
  const DecodeContextShard& shard = context_shard_;
  const int64_t Hi = config_.index_n_heads, Dk = config_.index_head_dim;
  const int64_t kv_len = st.start_position + n, local = shard.local_count(kv_len), most = shard.local_count(kv_len, 0);
  // This rank's keys (its pages of the indexer's key cache, rows in the layout's key format) and their positions.
  const std::vector<int32_t> table = shard.local_table(*st.block_table);
  const int64_t key_bytes = static_cast<int64_t>(indexer_key_row_bytes(key_format, Dk));
  std::vector<uint8_t> keys(static_cast<size_t>(local * key_bytes));
  std::vector<int64_t> positions(local);
  for (int64_t k = 0; k < local; ++k) {
    const int64_t slot = static_cast<int64_t>(table[k / page]) * page + k % page;
    std::memcpy(keys.data() + k * key_bytes, key_cache + slot * key_bytes, static_cast<size_t>(key_bytes));
    positions[k] = shard.position(k, shard.rank);
  }
  // Scores of its own keys, padded to rank 0's count with −inf; then every rank's to every rank, back in position
  // order. The selection (cpu::dsa_select_topk, torch's tie-break) depends on the whole row, so the rows are gathered
  // rather than each rank's local top-k: the same row gives one rank's selection exactly.
  std::vector<float> mine(n * most, -std::numeric_limits<float>::infinity()), all(shard.world * n * most);
  std::vector<float> own_scores(n * local);
  if (key_format == IndexerKeyFormat::kFp8E4m3Scaled)
    cpu::dsa_indexer_scores_fp8_at(q, keys.data(), positions.data(), w, n, st.start_position, local, Hi, Dk, scale,
                                   own_scores.data());
  else
    cpu::dsa_indexer_scores_at(q, reinterpret_cast<const float*>(keys.data()), positions.data(), w, n,
                               st.start_position, local, Hi, Dk, scale, own_scores.data());
  for (int64_t s = 0; s < n; ++s) std::copy_n(own_scores.data() + s * local, local, mine.data() + s * most);
  KILN_RETURN_IF_ERROR(context_group_->all_gather(mine.data(), all.data(), n * most, DType::kF32, kHost));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t p = 0; p < kv_len; ++p)
      scores[s * kv_len + p] = all[((p % shard.world) * n + s) * most + p / shard.world];
  return ok_status();
}

}  // namespace kiln
