// MlaMoeModel under decode-context parallelism: the pieces of attention and of the DSA indexer that read the KV cache
// split by token over a group of D ranks (decode_context_shard.h for the addressing, mla_moe_model.h for the design).
// Every function here is a meeting of the group: its ranks call it together for the same sequences in the same order.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/mla_partial_attention.h"
#include "model/mla_moe_model.h"

namespace kiln {
namespace {

const Stream kHost{Device::cpu(), nullptr};

// This rank's own cached rows [local_count(len), latent + rope] through the layout (which decodes its storage),
// over its local table: its pages are an ordinary paged cache of its own tokens.
Status own_rows(const SequenceStep& st, const DecodeContextShard& shard, int64_t len, const void* pages,
                const KvLayout& layout, float* rows) {
  const int64_t local = shard.local_count(len);
  if (local == 0) return ok_status();
  const std::vector<int32_t> table = shard.local_table(*st.block_table);
  const KvGatherSeq seq{0, 0, static_cast<int32_t>(local), 0};
  KvGatherArgs g;
  g.pages = pages, g.block_tables = table.data(), g.max_blocks = static_cast<int64_t>(table.size());
  g.seqs = &seq, g.num_seqs = 1, g.max_kv_len = local, g.out = rows;
  return layout.gather(g, {});
}

}  // namespace

Status MlaMoeModel::context_rows(const SequenceStep& st, int64_t ctx, const void* pages, const KvLayout& layout,
                                 float* rows) const {
  const DecodeContextShard& shard = context_shard_;
  const int64_t row = config_.kv_lora_rank + config_.qk_rope_head_dim;
  // Rank 0 owns the most positions; every rank sends that many rows (all_gather takes blocks of one size).
  const int64_t most = shard.local_count(ctx, 0);
  std::vector<float> mine(most * row, 0.0f), all(shard.world * most * row);
  KILN_RETURN_IF_ERROR(own_rows(st, shard, ctx, pages, layout, mine.data()));
  KILN_RETURN_IF_ERROR(context_group_->all_gather(mine.data(), all.data(), most * row, DType::kF32, kHost));
  for (int64_t p = 0; p < ctx; ++p)
    std::copy_n(all.data() + ((p % shard.world) * most + p / shard.world) * row, row, rows + p * row);
  return ok_status();
}

Status MlaMoeModel::context_attend(const SequenceStep& st, int64_t n, const float* qa, const int32_t* selected,
                                   int64_t selected_width, float scale, const void* pages, const KvLayout& layout,
                                   float* o_lat) const {
  const DecodeContextShard& shard = context_shard_;
  const int64_t L = config_.kv_lora_rank, R = config_.qk_rope_head_dim, row = L + R;
  const int64_t heads = config_.num_attention_heads;
  // The group is D consecutive tensor-parallel ranks; it attends the heads they own together.
  const TensorShard& tp = weights_.shard;
  const int first = tp.rank - shard.rank;
  const int64_t group_begin = TensorShard{first, tp.world}.begin(heads);
  const int64_t group_heads = TensorShard{first + shard.world - 1, tp.world}.end(heads) - group_begin;
  const int64_t own_begin = tp.begin(heads) - group_begin, own = tp.count(heads);

  // 1. Every rank of the group gets the absorbed queries of every head of the group (blocks padded to one size).
  const int64_t most = tp.max_count(heads);
  std::vector<float> send(n * most * row, 0.0f), all_q(shard.world * n * most * row), q(n * group_heads * row);
  for (int64_t i = 0; i < n; ++i) std::copy_n(qa + i * own * row, own * row, send.data() + i * most * row);
  KILN_RETURN_IF_ERROR(context_group_->all_gather(send.data(), all_q.data(), n * most * row, DType::kF32, kHost));
  for (int m = 0; m < shard.world; ++m) {
    const TensorShard member{first + m, tp.world};
    const int64_t offset = member.begin(heads) - group_begin, count = member.count(heads);
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(all_q.data() + (m * n + i) * most * row, count * row, q.data() + (i * group_heads + offset) * row);
  }

  // 2. Attention of those heads over this rank's own visible (DSA: selected) tokens, with each head's LSE.
  const int64_t kv_len = st.start_position + n, local = shard.local_count(kv_len);
  std::vector<float> rows(local * row);
  KILN_RETURN_IF_ERROR(own_rows(st, shard, kv_len, pages, layout, rows.data()));
  std::vector<float> part(n * group_heads * L), part_lse(n * group_heads);
#pragma omp parallel
  {
    std::vector<int64_t> keys;
    std::vector<char> chosen;
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = st.start_position + i;
      const int64_t visible = shard.local_count(position + 1);  // own tokens at positions ≤ the query's
      keys.clear();
      if (selected == nullptr) {
        for (int64_t k = 0; k < visible; ++k) keys.push_back(k);
      } else {
        // A position listed twice is still one key; keys in position order, as the layout attends them.
        chosen.assign(static_cast<size_t>(visible), 0);
        for (int64_t j = 0; j < selected_width; ++j) {
          const int32_t p = selected[i * selected_width + j];
          if (p >= 0 && p <= position && shard.owns(p)) chosen[p / shard.world] = 1;
        }
        for (int64_t k = 0; k < visible; ++k)
          if (chosen[k]) keys.push_back(k);
      }
      const auto n_keys = static_cast<int64_t>(keys.size());
      scratch.resize(group_heads * n_keys + row);
      cpu::mla_attention_absorbed_partial(q.data() + i * group_heads * row, group_heads, L, R, rows.data(),
                                          keys.data(), n_keys, scale, part.data() + i * group_heads * L,
                                          part_lse.data() + i * group_heads, scratch.data());
    }
  }

  // 3. The group's partial results to every rank, merged in rank order; each rank keeps its own heads.
  std::vector<float> parts(shard.world * part.size()), lses(shard.world * part_lse.size());
  KILN_RETURN_IF_ERROR(context_group_->all_gather(part.data(), parts.data(), static_cast<int64_t>(part.size()),
                                                  DType::kF32, kHost));
  KILN_RETURN_IF_ERROR(context_group_->all_gather(part_lse.data(), lses.data(),
                                                  static_cast<int64_t>(part_lse.size()), DType::kF32, kHost));
  std::vector<float> merged(part.size());
  cpu::merge_attention_partials(parts.data(), lses.data(), shard.world, n * group_heads, L, merged.data(), nullptr);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(merged.data() + (i * group_heads + own_begin) * L, own * L, o_lat + i * own * L);
  return ok_status();
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
