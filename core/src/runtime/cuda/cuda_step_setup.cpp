#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/cuda/cuda_model_step.h"

namespace kiln::cuda {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

Status blas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

int64_t round_up_pow2(int64_t v, int64_t at_least) {
  int64_t p = at_least;
  while (p < v) p *= 2;
  return p;
}

Status build_step_layout(std::span<const SequenceStep> steps, const CacheViews& kv, const ModelConfig& c,
                         StepLayout& L, std::vector<int64_t>& first_row, const DecodeContextShard& context) {
  const int64_t bs = kv.block_size;
  L.ids.clear(), L.positions.clear(), L.slots.clear(), L.query_seq.clear(), L.kv_len.clear(), L.rows.clear();
  L.prefill.clear(), L.prefill_keys = 0, L.max_local_kv = 1, L.context_rows = 0;
  // Split context: engine block b holds page = bs / D tokens of this rank in its page b.
  const int64_t page = bs / context.world;
  if (context.split() && bs % context.world != 0)
    return invalid_argument("decode-context parallelism: the scheduler's block of " + std::to_string(bs) +
                            " tokens does not split over " + std::to_string(context.world) + " ranks");
  // DSA attends through its top-k selection, which the expanded prefill kernel does not take.
  const bool expanded_prefill = !c.has_indexer();
  first_row.clear();
  L.max_blocks = 1, L.max_kv = 1;
  for (const SequenceStep& s : steps) {
    if (!s.block_table) return invalid_argument("sequence step has no block table");
    L.max_blocks = std::max<int64_t>(L.max_blocks, static_cast<int64_t>(s.block_table->size()));
  }
  // Rounded up to a power of two, so a growing context changes a captured graph's shape only rarely.
  L.max_blocks = round_up_pow2(L.max_blocks, 4);
  L.tables.assign(steps.size() * L.max_blocks, 0);
  for (size_t si = 0; si < steps.size(); ++si) {
    const SequenceStep& s = steps[si];
    const int64_t n = static_cast<int64_t>(s.tokens.size()), end = s.start_position + n;
    KILN_RETURN_IF_ERROR(check_sequence_step(s, si, bs, c));
    for (size_t blk_i = 0; blk_i < s.block_table->size(); ++blk_i) {
      const int32_t blk = (*s.block_table)[blk_i];
      if (blk < 0 || blk >= kv.num_blocks)
        return out_of_range("block " + std::to_string(blk) + " is outside the GPU KV pool (" +
                            std::to_string(kv.num_blocks) + " blocks)");
      L.tables[si * L.max_blocks + blk_i] = blk;
    }
    const int64_t first = L.tokens();
    const bool prefills = expanded_prefill && n >= kPrefillMinTokens;
    if (prefills) {
      L.prefill.push_back({first, n, end, static_cast<int64_t>(si)});
      L.prefill_keys += end;
      L.context_rows += context.local_count(end, 0);
    }
    first_row.push_back(L.logit_rows());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s.start_position + i;
      L.ids.push_back(s.tokens[i]);
      L.positions.push_back(pos);
      L.query_seq.push_back(static_cast<int32_t>(si));
      if (!context.split()) {
        L.slots.push_back(kv_slot(*s.block_table, bs, pos));
        L.kv_len.push_back(prefills ? 1 : static_cast<int32_t>(pos + 1));
      } else {
        // A prefilling row's absorbed pass is overwritten by the prefill kernel: no keys for it here.
        L.slots.push_back(context.own_pool_slot(*s.block_table, page, pos));
        L.kv_len.push_back(prefills ? 0 : static_cast<int32_t>(context.local_count(pos + 1)));
        L.max_local_kv = std::max<int64_t>(L.max_local_kv, L.kv_len.back());
      }
      if (s.all_logits || i == n - 1) L.rows.push_back(static_cast<int32_t>(first + i));
    }
    L.max_kv = std::max(L.max_kv, end);
  }
  return ok_status();
}

void carve_step_buffers(const ModelConfig& c, const StepShape& sh, StepScratch& sc, StepBuffers& b) {
  const int64_t N = sh.N, R = sh.R, S = sh.S;
  // H: this rank's heads (all of them on one rank); o_proj's input holds every head's output.
  const TensorShard& shard = sh.shard;
  const int64_t Hd = c.hidden_size, H = shard.count(c.num_attention_heads), L = c.kv_lora_rank, Rr = c.qk_rope_head_dim;
  const int64_t qk = c.qk_nope_head_dim + Rr, D = L + Rr, vd = c.v_head_dim;
  const int64_t E = std::max<int64_t>(c.n_routed_experts, 1), topk = std::max<int64_t>(c.num_experts_per_tok, 1);
  const int64_t moe_I = c.moe_intermediate_size;
  const int64_t dense_I = std::max(c.intermediate_size, moe_I * c.n_shared_experts);
  // F: rows of the whole step (layer-major prefill runs it in tiles of N rows; the arrays of all rows are these).
  const int64_t F = std::max(sh.full_rows, N);
  b.ids = sc.carve<int32_t>(F), b.query_seq = sc.carve<int32_t>(F), b.kv_len = sc.carve<int32_t>(F);
  b.tables = sc.carve<int32_t>(S * sh.max_blocks), b.rows = sc.carve<int32_t>(R);
  b.positions = sc.carve<int64_t>(F), b.slots = sc.carve<int64_t>(F);
  b.resid = sc.carve<float>(F * Hd);
  b.h = sc.carve<uint16_t>(F * Hd), b.y = sc.carve<uint16_t>(N * Hd);
  b.qkv_a = sc.carve<float>(N * (std::max<int64_t>(c.q_lora_rank, 0) + D));
  b.q_res_n = sc.carve<uint16_t>(N * std::max<int64_t>(c.q_lora_rank, 1));
  b.q = sc.carve<float>(N * H * qk), b.q_bf = sc.carve<uint16_t>(N * H * qk);
  b.q_abs = sc.carve<float>(N * H * D), b.o_lat_bf = sc.carve<uint16_t>(N * H * L);
  b.attn = sc.carve<uint16_t>(N * c.num_attention_heads * vd);
  b.mla_workspace = sh.attend.workspace_bytes ? sc.carve<char>(sh.attend.workspace_bytes) : nullptr;
  b.gu = sc.carve<uint16_t>(N * 2 * dense_I), b.act = sc.carve<uint16_t>(N * dense_I), b.shared = sc.carve<uint16_t>(N * Hd);
  b.h32 = sc.carve<float>(N * Hd), b.router_logits = sc.carve<float>(N * E), b.route_w = sc.carve<float>(N * topk);
  b.route_ids = sc.carve<int32_t>(N * topk), b.offsets = sc.carve<int32_t>(E + 1), b.active = sc.carve<int32_t>(E);
  b.order = sc.carve<int32_t>(N * topk);
  b.expert_workspace = sh.expert_workspace ? sc.carve<char>(sh.expert_workspace) : nullptr;
  b.moe_y = sc.carve<float>(N * (topk + 1) * Hd);  // + N rows: a shared expert folded into the routed launches
  b.normed = sc.carve<uint16_t>(F * Hd), b.row_states = sc.carve<uint16_t>(R * Hd);
  b.logits = sc.carve<float>(R * c.vocab_size), b.hidden = sh.want_hidden ? sc.carve<float>(F * Hd) : nullptr;
  b.taps = sh.taps ? sc.carve<float>(sh.taps * F * Hd) : nullptr;
  const bool dsa = c.has_indexer();
  b.idx_q = dsa ? sc.carve<float>(N * c.index_n_heads * c.index_head_dim) : nullptr;
  b.idx_k = dsa ? sc.carve<float>(N * c.index_head_dim) : nullptr;
  b.idx_w = dsa ? sc.carve<float>(N * c.index_n_heads) : nullptr;
  b.idx_scores = dsa ? sc.carve<float>(N * sh.scores_kv) : nullptr;
  b.selected = dsa ? sc.carve<int32_t>(N * c.index_topk) : nullptr;
  b.prefill_workspace = sh.prefill_workspace ? sc.carve<char>(sh.prefill_workspace) : nullptr;
  b.prev = sh.mtp ? sc.carve<float>(N * Hd) : nullptr, b.cat = sh.mtp ? sc.carve<uint16_t>(N * 2 * Hd) : nullptr;
  b.attn_local = nullptr, b.act_local = nullptr, b.logits_local = nullptr, b.ids_local = nullptr;
  b.pair_ids_local = nullptr, b.gather_send = nullptr, b.gather_recv = nullptr;
  b.q_group = nullptr, b.ctx_part = nullptr, b.ctx_lse = nullptr, b.ctx_parts = nullptr, b.ctx_lses = nullptr;
  b.ctx_rows_send = nullptr, b.ctx_rows_recv = nullptr, b.ctx_gather_seqs = nullptr;
  const DecodeContextShard& context = sh.context;
  if (context.split()) {
    const int64_t Ht = c.num_attention_heads, W = context.world;
    b.q_group = sc.carve<float>(N * Ht * D);
    b.ctx_part = sc.carve<float>(N * Ht * L), b.ctx_lse = sc.carve<float>(N * Ht);
    b.ctx_parts = sc.carve<float>(W * N * Ht * L), b.ctx_lses = sc.carve<float>(W * N * Ht);
    if (sh.context_rows > 0) {
      b.ctx_rows_send = sc.carve<uint16_t>(sh.context_rows * D);
      b.ctx_rows_recv = sc.carve<uint16_t>(W * sh.context_rows * D);
      b.ctx_gather_seqs = sc.carve<KvGatherSeq>(S);
    }
  }
  if (shard.sharded()) {
    const int64_t V = c.vocab_size;
    b.attn_local = sc.carve<uint16_t>(N * H * vd);
    b.act_local = sc.carve<uint16_t>(N * std::max<int64_t>(shard.count(c.intermediate_size), 1));
    b.logits_local = sc.carve<float>(R * shard.count(V));
    b.ids_local = sc.carve<int32_t>(N), b.pair_ids_local = sc.carve<int32_t>(N * topk);
    const size_t staging =
        std::max({gather_staging_bytes(shard, N, c.num_attention_heads, vd, DType::kBF16),
                  gather_staging_bytes(shard, N, c.intermediate_size, 1, DType::kBF16),
                  gather_staging_bytes(shard, R, V, 1, DType::kF32), sh.extra_gather_staging,
                  context.split() ? gather_staging_bytes(shard, N, c.num_attention_heads, D, DType::kF32) : 0});
    b.gather_send = sc.carve<char>(staging), b.gather_recv = sc.carve<char>(staging * shard.world);
  }
}

Status upload_step_layout(const StepLayout& L, const StepBuffers& b, PinnedUploadRing& staging, cudaStream_t stream) {
  const size_t N = L.ids.size(), R = L.rows.size();
  char* const first = reinterpret_cast<char*>(b.ids);
  const size_t span = static_cast<size_t>(reinterpret_cast<char*>(b.slots + N) - first);
  KILN_ASSIGN_OR_RETURN(char* host, staging.acquire(span));
  auto pack = [&](const void* dst, const void* src, size_t bytes) {
    std::memcpy(host + (static_cast<const char*>(dst) - first), src, bytes);
  };
  pack(b.ids, L.ids.data(), N * 4);
  pack(b.query_seq, L.query_seq.data(), N * 4);
  pack(b.kv_len, L.kv_len.data(), N * 4);
  pack(b.tables, L.tables.data(), L.tables.size() * 4);
  pack(b.rows, L.rows.data(), R * 4);
  pack(b.positions, L.positions.data(), N * 8);
  pack(b.slots, L.slots.data(), N * 8);
  return staging.submit(first, span, stream, "step upload");
}

Status copy_device_tokens(std::span<const SequenceStep> steps, int32_t* ids, cudaStream_t stream) {
  int64_t row = 0;
  for (const SequenceStep& s : steps) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (s.device_tokens)
      KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(ids + row, s.device_tokens, static_cast<size_t>(n) * 4,
                                                   cudaMemcpyDeviceToDevice, stream),
                                   "step tokens from the device"));
    row += n;
  }
  return ok_status();
}

}  // namespace kiln::cuda
