// The built-in `bf16` KV layout on CUDA: pages bf16 [block_size, latent + rope] (what the CPU `bf16` layout
// stores), appended by the fused RoPE + cache-write kernel (one launch with the queries), attended by the
// tensor-core decode kernel at the production widths (latent 512 + rope 64, no DSA selection) and by the plain
// CUDA-core kernel elsewhere, gathered by a paged row copy.
#include <algorithm>
#include <string>

#include "builtin/paged_mla_kv_layout.h"
#include "kernels/cuda/mla_decode.h"
#include "kiln/cuda/mla_decode_sync.h"
#include "runtime/cuda/cuda_device_context.h"
#include "runtime/cuda/mla_latent_gather.h"
#include "runtime/cuda/mla_rope_cache_write.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::builtin {
namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

int64_t round_up_pow2(int64_t v, int64_t at_least) {
  int64_t p = at_least;
  while (p < v) p *= 2;
  return p;
}

class Bf16KvLayoutCuda final : public KvLayout {
 public:
  Bf16KvLayoutCuda(KvGeometry g, Device device)
      : g_(g), device_(device), row_(g.latent_dim + g.rope_dim), sync_(device.index) {}

  KvGeometry geometry() const override { return g_; }
  size_t bytes_per_token() const override { return static_cast<size_t>(row_) * 2; }
  Device device() const override { return device_; }
  uint32_t append_fusions() const override { return kKvFuseNormRope | kKvFuseQueries | kKvFuseQueriesBf16Only; }

  Status append(const KvAppendArgs& a, Stream stream) const override {
    cuda::MlaRopeCacheWrite w;
    w.q = a.q, w.ckv = a.rows, w.ckv_stride = a.row_stride, w.n = a.n, w.heads = a.q ? a.heads : 0, w.nope = a.nope;
    w.rope = g_.rope_dim, w.latent = g_.latent_dim;
    w.positions = a.positions, w.inv_freq = a.inv_freq, w.attention_factor = a.rope_factor;
    w.norm_weight = a.norm_weight, w.eps = a.eps, w.slots = a.slots, w.cache = static_cast<uint16_t*>(a.pages);
    w.q_bf = a.q_bf, w.q_abs = a.q_abs;
    if (!w.cache) return invalid_argument("kv layout `bf16` append: null pages");
    return cuda::mla_rope_cache_write(w, cuda::cuda_stream_of(stream));
  }

  // The tensor-core kernel takes 512 + 64 without a selection, and 512 + 0 (NoPE DSA: GLM-5.3-Flash) with or
  // without one; everything else the plain kernel, whose score rows are rounded up to a power of two so a growing
  // context changes the shape (and a captured graph) only rarely. (512 + 64 with a selection, GLM-5, stays on the
  // plain kernel, which the CPU model's bf16 precision mode mirrors.)
  bool fast(const MlaAttendShape& s) const {
    if (g_.latent_dim != cuda::kMlaLatentDim) return false;
    if (g_.rope_dim == 0) return true;
    return g_.rope_dim == cuda::kMlaRopeDim && s.selected_width == 0;
  }
  int64_t reference_width(const MlaAttendShape& s) const {
    const int64_t kv = round_up_pow2(std::max<int64_t>(s.max_kv_len, 1), 16);
    return s.selected_width > 0 ? std::max(kv, s.selected_width) : kv;
  }

  MlaAttendPlan plan_attend(const MlaAttendShape& s) const override {
    MlaAttendPlan p;
    const int64_t rows = s.num_queries * s.num_heads;
    if (fast(s)) {
      // Batch invariance: each row is split by its own length. Those grids are rounded up to 16 splits (the extra
      // ones are empty), so a growing context re-captures the step's graph every 1,024 keys rather than every 64.
      // A selection is a fixed number of keys (its width) at any context.
      const int64_t keys = s.selected_width > 0 ? s.selected_width : s.max_kv_len;
      p.split_by_length = s.batch_invariant;
      p.num_splits = p.split_by_length
                         ? static_cast<int>((cuda::mla_decode_length_splits(keys) + 15) / 16 * 16)
                         : cuda::mla_decode_num_splits(s.num_queries, s.num_heads, keys, s.multiprocessor_count);
      p.workspace_bytes = p.num_splits > 1 ? cuda::mla_decode_workspace_bytes(s.num_queries, s.num_heads, p.num_splits) : 0;
      return p;
    }
    // Score rows, then an fp32 output for callers that want bf16 only. The score-row width is baked into the launch.
    p.launch_key = reference_width(s);
    p.workspace_bytes = align256(static_cast<size_t>(rows * reference_width(s)) * 4) +
                        align256(static_cast<size_t>(rows * g_.latent_dim) * 4);
    return p;
  }

  Status attend(const MlaAttendArgs& a, Stream stream) const override {
    const cudaStream_t st = cuda::cuda_stream_of(stream);
    MlaAttendShape shape;
    shape.selected_width = a.selected ? a.selected_width : 0;
    if (fast(shape)) {
      cuda::MlaDecodeParams p;
      p.q = a.q, p.num_queries = a.num_queries, p.num_heads = a.num_heads, p.cache = static_cast<const uint16_t*>(a.cache);
      p.block_size = g_.block_size, p.block_tables = a.block_tables, p.max_blocks = a.max_blocks;
      p.query_seq = a.query_seq, p.kv_len = a.kv_len, p.scale = a.scale, p.out = a.out, p.out_bf16 = a.out_bf16;
      p.out_lse = a.out_lse, p.rope_dim = g_.rope_dim;
      p.selected = a.selected, p.selected_width = a.selected ? a.selected_width : 0;
      p.num_splits = a.num_splits, p.split_by_length = a.split_by_length, p.workspace = a.workspace;
      p.sync = sync_.get();
      return cuda::mla_decode_bf16(p, st);
    }
    shape.num_queries = a.num_queries, shape.num_heads = a.num_heads, shape.max_kv_len = a.max_kv_len;
    const int64_t width = reference_width(shape);
    const size_t score_bytes = align256(static_cast<size_t>(a.num_queries * a.num_heads * width) * 4);
    const size_t out_bytes = align256(static_cast<size_t>(a.num_queries * a.num_heads * g_.latent_dim) * 4);
    if (!a.workspace || a.workspace_bytes < score_bytes + out_bytes)
      return invalid_argument("kv layout `bf16` attend: the plain kernel needs plan_attend's workspace (" +
                              std::to_string(score_bytes + out_bytes) + " bytes for this shape)");
    cuda::MlaReferenceParams p;
    p.q = a.q, p.rows = a.num_queries, p.heads = a.num_heads, p.latent_dim = g_.latent_dim, p.rope_dim = g_.rope_dim;
    p.cache = static_cast<const uint16_t*>(a.cache), p.block_size = g_.block_size, p.block_tables = a.block_tables;
    p.max_blocks = a.max_blocks, p.query_seq = a.query_seq, p.kv_len = a.kv_len, p.max_kv_len = width, p.scale = a.scale;
    p.selected = a.selected, p.selected_width = a.selected ? a.selected_width : 0;
    p.scores = static_cast<float*>(a.workspace), p.lse = a.out_lse;
    p.out = a.out ? a.out : reinterpret_cast<float*>(static_cast<char*>(a.workspace) + score_bytes);
    KILN_RETURN_IF_ERROR(cuda::mla_attention_reference(p, st));
    if (a.out_bf16)
      return cuda::f32_to_bf16(p.out, static_cast<size_t>(a.num_queries * a.num_heads * g_.latent_dim), a.out_bf16, st);
    return ok_status();
  }

  Status gather(const KvGatherArgs& a, Stream stream) const override {
    cuda::MlaLatentGather g;
    g.pages = static_cast<const uint16_t*>(a.pages), g.block_size = g_.block_size, g.row_width = row_;
    g.block_tables = a.block_tables, g.max_blocks = a.max_blocks, g.seqs = a.seqs, g.num_seqs = a.num_seqs;
    g.max_kv_len = a.max_kv_len, g.out = static_cast<uint16_t*>(a.out);
    return cuda::mla_gather_latent_rows(g, cuda::cuda_stream_of(stream));
  }

 private:
  KvGeometry g_;
  Device device_;
  int64_t row_;
  cuda::MlaDecodeSync sync_;  // the decode kernel's merge counters (one stream uses a layout at a time)
};

}  // namespace

Result<std::unique_ptr<KvLayout>> create_bf16_kv_layout_cuda(const CreateContext& context) {
  KILN_ASSIGN_OR_RETURN(KvGeometry g, kv_geometry(context, "bf16"));
  if (g.rope_dim % 2 != 0 || g.rope_dim > 128)
    return unimplemented("kv layout `bf16` on CUDA takes an even rope width ≤ 128 (got " + std::to_string(g.rope_dim) + ")");
  return std::unique_ptr<KvLayout>(new Bf16KvLayoutCuda(g, context.device));
}

}  // namespace kiln::builtin
