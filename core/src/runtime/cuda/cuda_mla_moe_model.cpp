#include "runtime/cuda/cuda_mla_moe_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "model/mla_moe_model.h"
#include "model/rope_setup.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

// As the CPU model: HF builds q_a_layernorm and kv_a_layernorm with the class default eps.
constexpr float kLatentNormEps = 1e-6f;

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

Status blas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

// One step's device buffers (see forward() for what each holds).
struct StepBuffers {
  int32_t *ids, *query_seq, *kv_len, *tables, *rows;
  int64_t *positions, *slots;
  float* resid;
  uint16_t *h, *y, *q_res, *q_res_n, *q_bf, *o_lat_bf, *attn;
  float *q, *ckv, *q_abs, *o_lat, *scores;
  void* mla_workspace;
  uint16_t *gu, *act, *shared;
  float *h32, *router_logits, *route_w, *moe_y;
  int32_t *route_ids, *offsets, *active, *order;
  uint16_t *moe_h, *normed, *row_states;
  float *logits, *hidden;
};

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(CudaMlaMoeModel& model, std::unique_ptr<DeviceArena> arena, GpuKvPool pool)
      : model_(model), arena_(std::move(arena)), pool_(std::move(pool)) {}
  Status forward(std::span<const SequenceStep> steps, StepOutput& out, bool keep_hidden) override {
    return model_.forward(steps, pool_, out, keep_hidden);
  }
  int64_t vocab_size() const override { return model_.config().vocab_size; }

 private:
  CudaMlaMoeModel& model_;
  std::unique_ptr<DeviceArena> arena_;
  GpuKvPool pool_;
};

int64_t round_up_pow2(int64_t v, int64_t at_least) {
  int64_t p = at_least;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

// What a captured step bakes in: buffer addresses (the scratch base and its layout) and launch shapes.
struct GraphKey {
  int64_t steps, rows, max_blocks, scores_kv;
  int splits;
  bool keep_hidden;
  const void* scratch;
  bool operator==(const GraphKey&) const = default;
};

struct CudaMlaMoeModel::Impl {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<CublasGemm> gemm;
  DeviceArena arena;
  StepScratch scratch;
  float* inv_freq = nullptr;
  float rope_factor = 1.0f;
  int sm_count = 0;
  std::vector<int32_t> ids, query_seq, kv_len, tables, rows;
  std::vector<int64_t> positions, slots;
  std::vector<std::pair<GraphKey, cudaGraphExec_t>> graphs;
  static constexpr size_t kMaxGraphs = 32;

  void drop_graphs() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
  }
  ~Impl() {
    drop_graphs();
    gemm.reset();
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
  StreamHandle s() const { return stream; }
};

CudaMlaMoeModel::CudaMlaMoeModel(ModelConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {}
CudaMlaMoeModel::~CudaMlaMoeModel() = default;

bool CudaMlaMoeModel::device_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

size_t CudaMlaMoeModel::device_total_bytes() {
  size_t free_b = 0, total_b = 0;
  return cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? total_b : 0;
}

Status CudaMlaMoeModel::supports(const ModelConfig& c) {
  if (c.has_indexer())
    return unimplemented(c.source + ": " + c.model_type +
                         " uses the DSA sparse indexer, which the CUDA runner does not run yet; set model.device = \"cpu\"");
  if (c.qk_rope_head_dim > 0 && !c.rope.interleave)
    return unimplemented(c.source + ": rope_interleave = false is not supported by the CUDA runner (interleaved only)");
  if (c.hidden_size % 8 != 0 || c.moe_intermediate_size % 8 != 0)
    return unimplemented(c.source + ": the CUDA MoE kernels need hidden_size and moe_intermediate_size to be multiples of 8");
  return ok_status();
}

Result<std::shared_ptr<CudaMlaMoeModel>> CudaMlaMoeModel::create(const ModelConfig& c, const WeightSource* source,
                                                                 uint64_t seed) {
  KILN_RETURN_IF_ERROR(supports(c));
  std::shared_ptr<CudaMlaMoeModel> m(new CudaMlaMoeModel(c));
  Impl& I = *m->impl_;
  int device = 0;
  KILN_RETURN_IF_ERROR(cuda_ok(cudaGetDevice(&device), "cudaGetDevice"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaDeviceGetAttribute(&I.sm_count, cudaDevAttrMultiProcessorCount, device), "SM count"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  KILN_RETURN_IF_ERROR(blas_ok(cublasCreate(&I.blas), "cublasCreate"));
  KILN_RETURN_IF_ERROR(blas_ok(cublasSetStream(I.blas, I.stream), "cublasSetStream"));
  KILN_ASSIGN_OR_RETURN(I.gemm, CublasGemm::create());
  if (c.qk_rope_head_dim > 0) {
    const cpu::RopeConfig rope = kernel_rope_config(c);
    const std::vector<float> inv = cpu::rope_inv_freq(rope);
    I.rope_factor = static_cast<float>(cpu::rope_attention_factor(rope));
    KILN_ASSIGN_OR_RETURN(I.inv_freq, I.arena.allocate_array<float>(inv.size(), "rope inv_freq"));
    KILN_RETURN_IF_ERROR(
        cuda_ok(cudaMemcpy(I.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice), "inv_freq upload"));
  }
  KILN_ASSIGN_OR_RETURN(m->weights_, load_gpu_weights(c, source, I.arena, seed, I.s()));
  return m;
}

Result<std::unique_ptr<ModelRunner>> CudaMlaMoeModel::make_runner(int64_t num_blocks, int64_t block_size) {
  // KV pages in chunks of at most 1 GiB: one allocation per layer group rather than one huge block.
  auto arena = std::make_unique<DeviceArena>(size_t{1} << 30);
  KILN_ASSIGN_OR_RETURN(GpuKvPool pool, GpuKvPool::create(*arena, config_.num_hidden_layers, num_blocks, block_size,
                                                          config_.kv_lora_rank + config_.qk_rope_head_dim));
  return std::unique_ptr<ModelRunner>(new CudaRunner(*this, std::move(arena), std::move(pool)));
}

Status CudaMlaMoeModel::forward(std::span<const SequenceStep> steps, const GpuKvPool& kv, StepOutput& out,
                                bool keep_hidden) {
  const ModelConfig& c = config_;
  Impl& I = *impl_;
  const StreamHandle st = I.s();
  const int64_t Hd = c.hidden_size, H = c.num_attention_heads, L = c.kv_lora_rank, Rr = c.qk_rope_head_dim;
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim, qk = nope + Rr, D = L + Rr;
  const int64_t E = std::max<int64_t>(c.n_routed_experts, 1), topk = std::max<int64_t>(c.num_experts_per_tok, 1);
  const int64_t moe_I = c.moe_intermediate_size;
  const int64_t dense_I = std::max(c.intermediate_size, moe_I * c.n_shared_experts);
  const int64_t bs = kv.block_size();

  // Host side: the flattened tokens, their positions and slots, one query row per token, the padded block tables.
  I.ids.clear(), I.positions.clear(), I.slots.clear(), I.query_seq.clear(), I.kv_len.clear(), I.rows.clear();
  out.first_row.clear();
  int64_t max_blocks = 1, max_kv = 1;
  for (const SequenceStep& s : steps) {
    if (!s.block_table) return invalid_argument("sequence step has no block table");
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.block_table->size()));
  }
  max_blocks = round_up_pow2(max_blocks, 4);
  I.tables.assign(steps.size() * max_blocks, 0);
  for (size_t si = 0; si < steps.size(); ++si) {
    const SequenceStep& s = steps[si];
    const int64_t n = static_cast<int64_t>(s.tokens.size()), end = s.start_position + n;
    KILN_RETURN_IF_ERROR(check_sequence_step(s, si, bs, c));
    for (size_t b = 0; b < s.block_table->size(); ++b) {
      const int32_t blk = (*s.block_table)[b];
      if (blk < 0 || blk >= kv.num_blocks())
        return out_of_range("block " + std::to_string(blk) + " is outside the GPU KV pool (" +
                            std::to_string(kv.num_blocks()) + " blocks)");
      I.tables[si * max_blocks + b] = blk;
    }
    const int64_t first = static_cast<int64_t>(I.ids.size());
    out.first_row.push_back(static_cast<int64_t>(I.rows.size()));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = s.tokens[i];
      const int64_t pos = s.start_position + i;
      I.ids.push_back(id);
      I.positions.push_back(pos);
      I.slots.push_back(kv_slot(*s.block_table, bs, pos));
      I.query_seq.push_back(static_cast<int32_t>(si));
      I.kv_len.push_back(static_cast<int32_t>(pos + 1));
      if (s.all_logits || i == n - 1) I.rows.push_back(static_cast<int32_t>(first + i));
    }
    max_kv = std::max(max_kv, end);
  }
  const int64_t N = static_cast<int64_t>(I.ids.size()), R = static_cast<int64_t>(I.rows.size()), S = steps.size();
  const bool fast_attention = L == kMlaLatentDim && Rr == kMlaRopeDim;
  const int splits = fast_attention ? mla_decode_num_splits(N, H, max_kv, I.sm_count) : 1;
  // Widths rounded up to powers of two, so a growing context changes a captured graph's shape only rarely.
  const int64_t scores_kv = fast_attention ? 0 : round_up_pow2(max_kv, 16);

  StepBuffers b{};
  auto carve = [&](StepScratch& sc) {
    b.ids = sc.carve<int32_t>(N), b.query_seq = sc.carve<int32_t>(N), b.kv_len = sc.carve<int32_t>(N);
    b.tables = sc.carve<int32_t>(S * max_blocks), b.rows = sc.carve<int32_t>(R);
    b.positions = sc.carve<int64_t>(N), b.slots = sc.carve<int64_t>(N);
    b.resid = sc.carve<float>(N * Hd);
    b.h = sc.carve<uint16_t>(N * Hd), b.y = sc.carve<uint16_t>(N * Hd);
    b.q_res = sc.carve<uint16_t>(N * std::max<int64_t>(c.q_lora_rank, 1));
    b.q_res_n = sc.carve<uint16_t>(N * std::max<int64_t>(c.q_lora_rank, 1));
    b.q = sc.carve<float>(N * H * qk), b.q_bf = sc.carve<uint16_t>(N * H * qk), b.ckv = sc.carve<float>(N * D);
    b.q_abs = sc.carve<float>(N * H * D), b.o_lat = sc.carve<float>(N * H * L), b.o_lat_bf = sc.carve<uint16_t>(N * H * L);
    b.attn = sc.carve<uint16_t>(N * H * vd);
    b.mla_workspace = splits > 1 ? sc.carve<char>(mla_decode_workspace_bytes(N, H, splits)) : nullptr;
    b.scores = fast_attention ? nullptr : sc.carve<float>(N * H * scores_kv);
    b.gu = sc.carve<uint16_t>(N * 2 * dense_I), b.act = sc.carve<uint16_t>(N * dense_I), b.shared = sc.carve<uint16_t>(N * Hd);
    b.h32 = sc.carve<float>(N * Hd), b.router_logits = sc.carve<float>(N * E), b.route_w = sc.carve<float>(N * topk);
    b.route_ids = sc.carve<int32_t>(N * topk), b.offsets = sc.carve<int32_t>(E + 1), b.active = sc.carve<int32_t>(E);
    b.order = sc.carve<int32_t>(N * topk), b.moe_h = sc.carve<uint16_t>(N * topk * std::max<int64_t>(moe_I, 1));
    b.moe_y = sc.carve<float>(N * topk * Hd);
    b.normed = sc.carve<uint16_t>(N * Hd), b.row_states = sc.carve<uint16_t>(R * Hd);
    b.logits = sc.carve<float>(R * c.vocab_size), b.hidden = keep_hidden ? sc.carve<float>(N * Hd) : nullptr;
  };
  I.scratch.begin(true);
  carve(I.scratch);
  KILN_RETURN_IF_ERROR(I.scratch.ensure(I.scratch.offset()));
  I.scratch.begin(false);
  carve(I.scratch);

  auto upload = [&](void* dst, const void* src, size_t bytes) {
    return cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, I.stream), "step upload");
  };
  KILN_RETURN_IF_ERROR(upload(b.ids, I.ids.data(), N * 4));
  KILN_RETURN_IF_ERROR(upload(b.query_seq, I.query_seq.data(), N * 4));
  KILN_RETURN_IF_ERROR(upload(b.kv_len, I.kv_len.data(), N * 4));
  KILN_RETURN_IF_ERROR(upload(b.tables, I.tables.data(), I.tables.size() * 4));
  KILN_RETURN_IF_ERROR(upload(b.rows, I.rows.data(), R * 4));
  KILN_RETURN_IF_ERROR(upload(b.positions, I.positions.data(), N * 8));
  KILN_RETURN_IF_ERROR(upload(b.slots, I.slots.data(), N * 8));

  CublasGemm& g = *I.gemm;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float one = 1.0f, zero = 0.0f;

  // y = down(silu(gate(x)) · up(x)) for a dense MLP / shared expert with fused gate_up.
  auto dense_mlp = [&](const GpuLinear& gate_up, const GpuLinear& down, const uint16_t* x, uint16_t* y) -> Status {
    const int64_t inter = down.in;
    KILN_RETURN_IF_ERROR(g.linear(x, N, Hd, gate_up.w, 2 * inter, b.gu, DType::kBF16, st));
    KILN_RETURN_IF_ERROR(swiglu_bf16(b.gu, b.gu + inter, N, inter, 2 * inter, b.act, st));
    return g.linear(b.act, N, inter, down.w, Hd, y, DType::kBF16, st);
  };

  auto attention = [&](const GpuLayer& w, uint16_t* pages) -> Status {
    if (w.q_a.w) {
      KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.q_a.w, c.q_lora_rank, b.q_res, DType::kBF16, st));
      KILN_RETURN_IF_ERROR(rmsnorm_bf16(b.q_res, w.q_a_norm, N, c.q_lora_rank, kLatentNormEps, b.q_res_n, st));
      KILN_RETURN_IF_ERROR(g.linear(b.q_res_n, N, c.q_lora_rank, w.q_b.w, H * qk, b.q, DType::kF32, st));
    } else {
      KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.q_proj.w, H * qk, b.q, DType::kF32, st));
    }
    KILN_RETURN_IF_ERROR(g.linear(b.h, N, Hd, w.kv_a.w, D, b.ckv, DType::kF32, st));
    if (Rr > 0) {
      KILN_RETURN_IF_ERROR(apply_rope_interleaved_f32(b.q + nope, N, H, H * qk, qk, b.positions, I.inv_freq,
                                                      I.rope_factor, Rr, st));
      KILN_RETURN_IF_ERROR(apply_rope_interleaved_f32(b.ckv + L, N, 1, D, Rr, b.positions, I.inv_freq, I.rope_factor, Rr, st));
    }
    KILN_RETURN_IF_ERROR(mla_write_cache(b.ckv, N, L, Rr, w.kv_a_norm, kLatentNormEps, b.slots, pages, st));
    // Absorption: q_lat[t, h] = W_UK[h]ᵀ · q_nope[t, h], one GEMM per head (strided batch over kv_b's heads).
    KILN_RETURN_IF_ERROR(f32_to_bf16(b.q, N * H * qk, b.q_bf, st));
    KILN_RETURN_IF_ERROR(blas_ok(
        cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_N, CUBLAS_OP_N, L, N, nope, &one, w.kv_b.w, CUDA_R_16BF, L,
                                   (nope + vd) * L, b.q_bf, CUDA_R_16BF, H * qk, qk, &zero, b.q_abs, CUDA_R_32F, H * D, D,
                                   H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "MLA query absorption"));
    if (Rr > 0)
      KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(b.q_abs + L, D * sizeof(float), b.q + nope, qk * sizeof(float),
                                                     Rr * sizeof(float), N * H, cudaMemcpyDeviceToDevice, I.stream),
                                   "q_pe copy"));
    const float scale = static_cast<float>(c.attention_scale());
    if (fast_attention) {
      MlaDecodeParams p;
      p.q = b.q_abs, p.num_queries = N, p.num_heads = H, p.cache = pages, p.block_size = bs;
      p.block_tables = b.tables, p.max_blocks = max_blocks, p.query_seq = b.query_seq, p.kv_len = b.kv_len;
      p.scale = scale, p.out = b.o_lat, p.num_splits = splits, p.workspace = b.mla_workspace;
      KILN_RETURN_IF_ERROR(mla_decode_bf16(p, st));
    } else {
      MlaReferenceParams p;
      p.q = b.q_abs, p.rows = N, p.heads = H, p.latent_dim = L, p.rope_dim = Rr, p.cache = pages, p.block_size = bs;
      p.block_tables = b.tables, p.max_blocks = max_blocks, p.query_seq = b.query_seq, p.kv_len = b.kv_len;
      p.max_kv_len = scores_kv, p.scale = scale, p.scores = b.scores, p.out = b.o_lat;
      KILN_RETURN_IF_ERROR(mla_attention_reference(p, st));
    }
    // Back out of latent space: attn[t, h] = W_UV[h] · o_lat[t, h].
    KILN_RETURN_IF_ERROR(f32_to_bf16(b.o_lat, N * H * L, b.o_lat_bf, st));
    KILN_RETURN_IF_ERROR(blas_ok(
        cublasGemmStridedBatchedEx(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, vd, N, L, &one, w.kv_b.w + nope * L, CUDA_R_16BF,
                                   L, (nope + vd) * L, b.o_lat_bf, CUDA_R_16BF, H * L, L, &zero, b.attn, CUDA_R_16BF,
                                   H * vd, vd, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "MLA output un-absorption"));
    return g.linear(b.attn, N, H * vd, w.o_proj.w, Hd, b.y, DType::kBF16, st);
  };

  auto mlp = [&](const GpuLayer& w) -> Status {
    if (!w.is_moe) return dense_mlp(w.gate_up, w.down, b.h, b.y);
    // The gate in fp32, as the CPU model runs it.
    KILN_RETURN_IF_ERROR(bf16_to_f32(b.h, N * Hd, b.h32, st));
    KILN_RETURN_IF_ERROR(blas_ok(cublasSgemm(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, E, N, Hd, &one, w.router, Hd, b.h32, Hd,
                                             &zero, b.router_logits, E),
                                 "MoE router"));
    cpu::MoeRouterConfig rc;
    rc.num_experts = E;
    rc.top_k = topk;
    rc.n_group = c.n_group;
    rc.topk_group = c.topk_group;
    rc.norm_topk_prob = c.norm_topk_prob;
    rc.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
    KILN_RETURN_IF_ERROR(moe_route(b.router_logits, w.router_bias, N, rc, b.route_ids, b.route_w, st));
    const MoeDispatch d{b.offsets, b.active, b.order};
    KILN_RETURN_IF_ERROR(moe_group_by_expert(b.route_ids, N * topk, E, d, st));
    KILN_RETURN_IF_ERROR(moe_gate_up_swiglu_bf16(b.h, N, topk, Hd, moe_I, w.experts_gate_up, E, d,
                                                 std::numeric_limits<float>::infinity(), b.moe_h, st));
    KILN_RETURN_IF_ERROR(moe_down_bf16(b.moe_h, N * topk, moe_I, Hd, w.experts_down, E, d, b.route_w, b.moe_y, st));
    if (w.has_shared) KILN_RETURN_IF_ERROR(dense_mlp(w.gate_up, w.down, b.h, b.shared));
    return moe_combine_bf16(b.moe_y, N, topk, Hd, w.has_shared ? b.shared : nullptr, b.y, st);
  };

  // Everything from the embedding to the logits, on the stream: run directly, or captured into a graph.
  auto enqueue = [&]() -> Status {
  // The residual stream stays fp32; every block's input is add_rmsnorm(previous block's output).
  KILN_RETURN_IF_ERROR(embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, b.ids, N, b.y, st));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.resid, 0, N * Hd * sizeof(float), I.stream), "residual clear"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const GpuLayer& w = weights_.layers[l];
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.input_norm, N, Hd, eps, b.h, st));
    KILN_RETURN_IF_ERROR(attention(w, kv.layer_pages(l)).with_context("layer " + std::to_string(l) + " attention (GPU)"));
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.post_attention_norm, N, Hd, eps, b.h, st));
    KILN_RETURN_IF_ERROR(mlp(w).with_context("layer " + std::to_string(l) + " mlp (GPU)"));
  }
  KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, weights_.final_norm, N, Hd, eps, b.normed, st));
  if (keep_hidden) KILN_RETURN_IF_ERROR(bf16_to_f32(b.normed, N * Hd, b.hidden, st));
  // Logits only for the rows asked for (gathered with the embedding kernel, the normed states as the table).
  KILN_RETURN_IF_ERROR(embedding_gather_bf16(b.normed, N, Hd, b.rows, R, b.row_states, st));
  return g.linear(b.row_states, R, Hd, weights_.lm_head.w, c.vocab_size, b.logits, DType::kF32, st);
  };

  if (graphs_ && N == S) {
    const GraphKey key{S, R, max_blocks, scores_kv, splits, keep_hidden, I.scratch.base()};
    cudaGraphExec_t exec = nullptr;
    for (auto& [k, e] : I.graphs)
      if (k == key) exec = e;
    if (!exec) {
      if (I.graphs.size() >= Impl::kMaxGraphs || (!I.graphs.empty() && I.graphs.front().first.scratch != key.scratch))
        I.drop_graphs();
      KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamBeginCapture(I.stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
      const Status captured = enqueue();
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(I.stream, &graph);
      if (!captured.ok()) {
        if (graph) cudaGraphDestroy(graph);
        return captured;
      }
      KILN_RETURN_IF_ERROR(cuda_ok(end, "graph capture"));
      const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      KILN_RETURN_IF_ERROR(cuda_ok(inst, "graph instantiate"));
      I.graphs.emplace_back(key, exec);
    }
    KILN_RETURN_IF_ERROR(cuda_ok(cudaGraphLaunch(exec, I.stream), "graph launch"));
  } else {
    KILN_RETURN_IF_ERROR(enqueue());
  }
  if (keep_hidden) {
    out.hidden.resize(N * Hd);
    KILN_RETURN_IF_ERROR(cuda_ok(
        cudaMemcpyAsync(out.hidden.data(), b.hidden, N * Hd * sizeof(float), cudaMemcpyDeviceToHost, I.stream), "hidden"));
  }
  out.logits.resize(R * c.vocab_size);
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out.logits.data(), b.logits, R * c.vocab_size * sizeof(float),
                                               cudaMemcpyDeviceToHost, I.stream),
                               "logits"));
  return cuda_ok(cudaStreamSynchronize(I.stream), "forward step");
}

}  // namespace kiln::cuda
