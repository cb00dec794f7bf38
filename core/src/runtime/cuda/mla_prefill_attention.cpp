#include "runtime/cuda/mla_prefill_attention.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/head_batched_gemm.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/mla_kv_expand_sm90.h"
#include "kernels/cuda/skinny_gemm.h"

namespace kiln::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Workspace layout, in this order, each part 256-byte aligned.
struct Layout {
  size_t seqs, table_rows, latent, kv, blas, total;
};

Layout layout(int64_t num_seqs, int64_t total_keys, const MlaPrefillDims& d) {
  Layout l{};
  l.seqs = 0;
  l.table_rows = align_up(sizeof(MlaPrefillSeq) * num_seqs);  // the gather's KvGatherSeq table
  l.latent = l.table_rows + align_up(sizeof(KvGatherSeq) * num_seqs);
  l.kv = l.latent + align_up(sizeof(uint16_t) * total_keys * (d.latent_dim + d.rope_dim));
  l.blas = l.kv + align_up(sizeof(uint16_t) * total_keys * d.num_heads * (d.nope_dim + d.v_dim));
  l.total = l.blas + kHeadBatchedGemmWorkspaceBytes;  // the kv_b expansion's cuBLASLt workspace
  return l;
}

}  // namespace

size_t mla_prefill_workspace_bytes(int64_t num_seqs, int64_t total_keys, const MlaPrefillDims& dims) {
  return layout(num_seqs, total_keys, dims).total;
}

// The kernel's block order (MlaPrefillParams::heads_fastest / head_group): heads first while the longest query
// tile's keys are few enough that the tail decides (H100: 12 % at 4K keys against head-major), past that heads in
// pairs — two heads' tiles side by side share their K / V in L2 and still fill each other's tail (H100, whole model,
// same lease: a 32K prompt +0.7 % against head-major, which was 3 % ahead of heads first at 8K-32K; 128K the same).
// KILN_MLA_PREFILL_ORDER=heads|tiles|groupN forces one (A/B measurements; groupN: heads in groups of N).
namespace {
struct PrefillOrder {
  bool heads_fastest = true;
  int64_t head_group = 0;
};
PrefillOrder prefill_order(int64_t max_kv_len) {
  static const std::optional<PrefillOrder> forced = []() -> std::optional<PrefillOrder> {
    const char* v = std::getenv("KILN_MLA_PREFILL_ORDER");
    if (!v) return std::nullopt;
    const std::string s(v);
    if (s == "heads") return PrefillOrder{true, 0};
    if (s == "tiles") return PrefillOrder{false, 0};
    if (s.rfind("group", 0) == 0 && s.size() > 5) return PrefillOrder{true, std::max(1, std::atoi(s.c_str() + 5))};
    return std::nullopt;
  }();
  if (forced) return *forced;
  constexpr int64_t kHeadsFastestMaxKeys = 8192;
  if (max_kv_len <= kHeadsFastestMaxKeys) return PrefillOrder{true, 0};
  return PrefillOrder{true, 2};
}
}  // namespace

Status mla_prefill_attention(const MlaPrefillArgs& a, cublasContext* blas, StreamHandle stream) {
  const MlaPrefillDims& d = a.dims;
  if (d.num_heads <= 0 || d.nope_dim <= 0 || d.rope_dim < 0 || d.v_dim <= 0 || d.latent_dim <= 0)
    return invalid_argument("mla_prefill_attention: dims need num_heads, nope_dim, v_dim, latent_dim > 0");
  if (a.seqs.empty()) return ok_status();
  if (!a.q || !a.layout || !a.pages || !a.block_tables || !a.kv_b || !a.out || !a.workspace || a.block_size <= 0 ||
      a.max_blocks <= 0)
    return invalid_argument(
        "mla_prefill_attention: q, layout, pages, block_tables, kv_b, out, workspace and block shape must be set");

  // The device sequence table: rows and keys of each sequence, its keys packed one sequence after another.
  const int64_t n = static_cast<int64_t>(a.seqs.size());
  std::vector<MlaPrefillSeq> seqs(n);
  std::vector<KvGatherSeq> gather_seqs(n);
  int64_t total_keys = 0, max_q_len = 0, max_kv_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    const MlaPrefillSequence& s = a.seqs[i];
    const std::string which = "mla_prefill_attention: sequence " + std::to_string(i);
    if (s.q_len < 1 || s.q_len > s.kv_len) return invalid_argument(which + ": need 1 ≤ q_len ≤ kv_len");
    if (s.q_row < 0 || s.q_row + s.q_len > INT32_MAX || s.kv_len > INT32_MAX)
      return out_of_range(which + ": q_row / kv_len out of range");
    if ((s.kv_len + a.block_size - 1) / a.block_size > a.max_blocks)
      return out_of_range(which + ": kv_len needs more than max_blocks blocks");
    if (s.table_row < 0 || s.table_row > INT32_MAX) return out_of_range(which + ": table_row out of range");
    seqs[i] = MlaPrefillSeq{static_cast<int32_t>(s.q_row), static_cast<int32_t>(s.q_len),
                            static_cast<int32_t>(total_keys), static_cast<int32_t>(s.kv_len)};
    gather_seqs[i] = KvGatherSeq{static_cast<int32_t>(s.table_row), static_cast<int32_t>(total_keys),
                                 static_cast<int32_t>(s.kv_len), 0};
    total_keys += s.kv_len;
    max_q_len = std::max(max_q_len, s.q_len);
    max_kv_len = std::max(max_kv_len, s.kv_len);
  }
  if (total_keys > INT32_MAX) return out_of_range("mla_prefill_attention: more than 2^31 keys in one batch");
  // Keys laid out for (the heads' stride), and the first key this call gathers and expands.
  const int64_t capacity = a.key_capacity > 0 ? a.key_capacity : total_keys;
  const int64_t ready = a.keys_ready;
  if (capacity < total_keys || capacity > INT32_MAX)
    return invalid_argument("mla_prefill_attention: key_capacity " + std::to_string(capacity) + " below the batch's " +
                            std::to_string(total_keys) + " keys");
  if (ready < 0 || (ready > 0 && (n != 1 || ready >= total_keys || ready % a.block_size != 0 || a.gather_rows)))
    return invalid_argument("mla_prefill_attention: keys_ready " + std::to_string(ready) +
                            " needs one sequence, a whole number of blocks below its kv_len and the layout's gather");
  if (ready > 0) {  // the sequence's blocks from position `ready` on: its table row read from that block
    gather_seqs[0].key_start = static_cast<int32_t>(ready);
    gather_seqs[0].kv_len = static_cast<int32_t>(total_keys - ready);
  }
  const int64_t fresh = total_keys - ready;  // keys gathered and expanded by this call
  const Layout l = layout(n, capacity, d);
  if (a.workspace_bytes < l.total)
    return invalid_argument("mla_prefill_attention: workspace holds " + std::to_string(a.workspace_bytes) +
                            " bytes, needs " + std::to_string(l.total));
  char* ws = static_cast<char*>(a.workspace);
  auto* d_seqs = reinterpret_cast<MlaPrefillSeq*>(ws + l.seqs);
  auto* d_gather = reinterpret_cast<KvGatherSeq*>(ws + l.table_rows);
  auto* latent = reinterpret_cast<uint16_t*>(ws + l.latent);
  auto* kv = reinterpret_cast<uint16_t*>(ws + l.kv);
  // Pageable host memory: the copies are staged before cudaMemcpyAsync returns, so the vectors may go.
  cudaError_t e = cudaMemcpyAsync(d_seqs, seqs.data(), sizeof(MlaPrefillSeq) * n, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d_gather, gather_seqs.data(), sizeof(KvGatherSeq) * n, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess)
    return internal_error(std::string("mla_prefill_attention: sequence table upload: ") + cudaGetErrorString(e));

  const int64_t row_width = d.latent_dim + d.rope_dim;
  if (a.gather_rows) {
    KILN_RETURN_IF_ERROR(a.gather_rows(latent).with_context("mla_prefill_attention: gathering cached rows"));
  } else {
    KvGatherArgs g;
    g.pages = a.pages, g.block_tables = a.block_tables + ready / a.block_size, g.max_blocks = a.max_blocks;
    g.seqs = d_gather, g.num_seqs = n, g.max_kv_len = max_kv_len - ready, g.out = latent;
    KILN_RETURN_IF_ERROR(a.layout->gather(g, a.stream).with_context("mla_prefill_attention: gathering cached rows"));
  }

  // Head-major K_nope | V: [H][keys][nope + v], head h = latent[:, :L] · kv_b[h]ᵀ. A head's values must not depend
  // on how many heads share the call: a tensor-parallel rank expands only its heads and must get the one-rank bits
  // (greedy TP = TP=1). One cuBLAS GEMM over all heads is as wide as the rank's heads, and cuBLAS picks its kernel
  // (split-K / stream-K, so the summation order) by that width. Up to kSkinnyGemmLimit keys the skinny GEMM does
  // every head in one launch (its k split depends on L alone); past that, head_batched_gemm_bf16: one cuBLASLt
  // launch over the heads with the algorithm chosen for one head's problem, the same on every rank. Opt-in for A/B
  // runs (KILN_MLA_KV_EXPAND): `heads`, one cuBLAS call per head (the form before it, and the fallback where
  // cuBLASLt has no such algorithm); `sm90`, mla_kv_expand_sm90's one launch (measured slower).
  const int64_t hw = d.nope_dim + d.v_dim, L = d.latent_dim;
  if (hw > INT32_MAX || row_width > INT32_MAX || capacity * hw > INT64_MAX / d.num_heads)
    return out_of_range("mla_prefill_attention: kv_b too large");
  const uint16_t* const fresh_latent = latent + ready * row_width;
  uint16_t* const fresh_kv = kv + ready * hw;
  SkinnyStrides sk;
  sk.batches = d.num_heads, sk.x_row = row_width, sk.x_batch = 0, sk.w_batch = hw * L, sk.y_row = hw,
  sk.y_batch = capacity * hw;
  if (fresh <= kSkinnyGemmLimit && d.num_heads <= 65535 && row_width % 8 == 0 &&
      skinny_gemm_supported(fresh_latent, fresh, L, a.kv_b)) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.stream.device.index) != cudaSuccess) sms = 1;
    KILN_RETURN_IF_ERROR(skinny_gemm_strided_batched_bf16(fresh_latent, fresh, L, a.kv_b, hw, fresh_kv, DType::kBF16,
                                                          sk, false, sms, stream)
                             .with_context("mla_prefill_attention: kv_b expansion"));
  } else if (capacity == fresh && mla_kv_expand_sm90_applies(L, row_width, hw, latent, a.kv_b, kv)) {
    KILN_RETURN_IF_ERROR(mla_kv_expand_sm90(latent, total_keys, row_width, L, a.kv_b, d.num_heads, hw, kv, stream)
                             .with_context("mla_prefill_attention: kv_b expansion"));
  } else {
    const char* form = std::getenv("KILN_MLA_KV_EXPAND");
    bool expanded = false;
    if (!(form && std::strcmp(form, "heads") == 0)) {
      const Status batched = head_batched_gemm_bf16(fresh_latent, fresh, L, row_width, a.kv_b, hw, d.num_heads,
                                                    fresh_kv, ws + l.blas, stream, capacity * hw);
      if (!batched.ok() && batched.code() != StatusCode::kUnimplemented)
        return batched.with_context("mla_prefill_attention: kv_b expansion");
      expanded = batched.ok();
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bs = expanded ? CUBLAS_STATUS_SUCCESS : cublasSetStream(blas, stream);
    for (int64_t h = 0; h < d.num_heads && !expanded && bs == CUBLAS_STATUS_SUCCESS; ++h)
      bs = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(hw), static_cast<int>(fresh),
                        static_cast<int>(L), &one, a.kv_b + h * hw * L, CUDA_R_16BF, static_cast<int>(L), fresh_latent,
                        CUDA_R_16BF, static_cast<int>(row_width), &zero, fresh_kv + h * capacity * hw, CUDA_R_16BF,
                        static_cast<int>(hw), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS)
      return internal_error(std::string("mla_prefill_attention: kv_b expansion GEMM: ") + cublasGetStatusString(bs));
  }

  // k_rope is the latent rows' tail.
  MlaPrefillParams p;
  p.q = a.q, p.q_row_stride = d.num_heads * (d.nope_dim + d.rope_dim);
  p.k_nope = kv, p.k_nope_key_stride = hw, p.k_nope_head_stride = capacity * hw;
  p.k_rope = latent + d.latent_dim, p.k_rope_key_stride = row_width;
  p.v = kv + d.nope_dim, p.v_key_stride = hw, p.v_head_stride = capacity * hw;
  p.out = a.out, p.out_row_stride = d.num_heads * d.v_dim;
  p.seqs = d_seqs, p.num_seqs = n, p.max_q_len = max_q_len, p.total_keys = total_keys;
  p.num_heads = d.num_heads, p.nope_dim = d.nope_dim, p.rope_dim = d.rope_dim, p.v_dim = d.v_dim;
  p.scale = a.scale;
  const PrefillOrder order = prefill_order(max_kv_len);
  p.heads_fastest = order.heads_fastest, p.head_group = order.head_group;
  return mla_prefill_bf16(p, stream);
}

}  // namespace kiln::cuda
