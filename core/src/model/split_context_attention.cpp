#include "model/split_context_attention.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/mla_partial_attention.h"

namespace kiln {
namespace {

const Stream kHost{Device::cpu(), nullptr};

}  // namespace

Status gather_split_rows(const SplitContext& split, int64_t ctx, int64_t row, const OwnContextRows& own, float* rows) {
  const DecodeContextShard& shard = split.shard;
  if (ctx <= 0) return ok_status();  // every rank of the group skips the meeting alike (ctx is the group's)
  // Rank 0 owns the most positions; every rank sends that many rows (all_gather takes blocks of one size).
  const int64_t most = shard.local_count(ctx, 0);
  std::vector<float> mine(most * row, 0.0f), all(shard.world * most * row);
  if (shard.local_count(ctx) > 0) KILN_RETURN_IF_ERROR(own(shard.local_count(ctx), mine.data()));
  KILN_RETURN_IF_ERROR(split.group->all_gather(mine.data(), all.data(), most * row, DType::kF32, kHost));
  for (int64_t p = 0; p < ctx; ++p)
    std::copy_n(all.data() + ((p % shard.world) * most + p / shard.world) * row, row, rows + p * row);
  return ok_status();
}

Status own_latent_rows(const DecodeContextShard& shard, const SequenceStep& st, int64_t len, const void* pages,
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

Status attend_split_context(const SplitContext& split, int64_t heads, int64_t latent, int64_t rope,
                            const SequenceStep& st, int64_t n, const float* qa, const int32_t* selected,
                            int64_t selected_width, float scale, const void* pages, const KvLayout& layout,
                            float* o_lat) {
  const DecodeContextShard& shard = split.shard;
  const int64_t L = latent, row = latent + rope;
  // The group is D consecutive tensor-parallel ranks; it attends the heads they own together.
  const TensorShard& tp = split.heads;
  const int first = tp.rank - shard.rank;
  const int64_t group_begin = TensorShard{first, tp.world}.begin(heads);
  const int64_t group_heads = TensorShard{first + shard.world - 1, tp.world}.end(heads) - group_begin;
  const int64_t own_begin = tp.begin(heads) - group_begin, own = tp.count(heads);

  // 1. Every rank of the group gets the absorbed queries of every head of the group (blocks padded to one size).
  const int64_t most = tp.max_count(heads);
  std::vector<float> send(n * most * row, 0.0f), all_q(shard.world * n * most * row), q(n * group_heads * row);
  for (int64_t i = 0; i < n; ++i) std::copy_n(qa + i * own * row, own * row, send.data() + i * most * row);
  KILN_RETURN_IF_ERROR(split.group->all_gather(send.data(), all_q.data(), n * most * row, DType::kF32, kHost));
  for (int m = 0; m < shard.world; ++m) {
    const TensorShard member{first + m, tp.world};
    const int64_t offset = member.begin(heads) - group_begin, count = member.count(heads);
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(all_q.data() + (m * n + i) * most * row, count * row, q.data() + (i * group_heads + offset) * row);
  }

  // 2. Attention of those heads over this rank's own visible (DSA: selected) tokens, with each head's LSE.
  const int64_t kv_len = st.start_position + n, local = shard.local_count(kv_len);
  std::vector<float> rows(local * row);
  KILN_RETURN_IF_ERROR(own_latent_rows(shard, st, kv_len, pages, layout, rows.data()));
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
      cpu::mla_attention_absorbed_partial(q.data() + i * group_heads * row, group_heads, L, rope, rows.data(),
                                          keys.data(), n_keys, scale, part.data() + i * group_heads * L,
                                          part_lse.data() + i * group_heads, scratch.data());
    }
  }

  // 3. The group's partial results to every rank, merged in rank order; each rank keeps its own heads.
  std::vector<float> parts(shard.world * part.size()), lses(shard.world * part_lse.size());
  KILN_RETURN_IF_ERROR(split.group->all_gather(part.data(), parts.data(), static_cast<int64_t>(part.size()),
                                               DType::kF32, kHost));
  KILN_RETURN_IF_ERROR(split.group->all_gather(part_lse.data(), lses.data(), static_cast<int64_t>(part_lse.size()),
                                               DType::kF32, kHost));
  std::vector<float> merged(part.size());
  cpu::merge_attention_partials(parts.data(), lses.data(), shard.world, n * group_heads, L, merged.data(), nullptr);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(merged.data() + (i * group_heads + own_begin) * L, own * L, o_lat + i * own * L);
  return ok_status();
}

}  // namespace kiln
