#include "runtime/cuda/cuda_mla_moe_model.h"

#include <string>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/norm.h"
#include "model/rope_setup.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

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

}  // namespace

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
  const int64_t Hd = c.hidden_size, H = c.num_attention_heads;
  StepLayout& lay = I.layout;
  KILN_RETURN_IF_ERROR(build_step_layout(steps, kv, c, lay, out));
  StepShape sh;
  sh.N = lay.tokens(), sh.R = lay.logit_rows(), sh.S = static_cast<int64_t>(steps.size()), sh.max_blocks = lay.max_blocks;
  sh.fast_attention = c.kv_lora_rank == kMlaLatentDim && c.qk_rope_head_dim == kMlaRopeDim;
  sh.splits = sh.fast_attention ? mla_decode_num_splits(sh.N, H, lay.max_kv, I.sm_count) : 1;
  sh.scores_kv = sh.fast_attention ? 0 : round_up_pow2(lay.max_kv, 16);
  const int64_t N = sh.N, R = sh.R;

  StepBuffers b{};
  I.scratch.begin(true);
  carve_step_buffers(c, sh, keep_hidden, I.scratch, b);
  KILN_RETURN_IF_ERROR(I.scratch.ensure(I.scratch.offset()));
  I.scratch.begin(false);
  carve_step_buffers(c, sh, keep_hidden, I.scratch, b);
  KILN_RETURN_IF_ERROR(upload_step_layout(lay, b, I.stream));

  const StepContext x{c, I, sh, b, kv.block_size()};
  CublasGemm& g = *I.gemm;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Everything from the embedding to the logits, on the stream: run directly, or captured into a graph.
  auto enqueue = [&]() -> Status {
    // The residual stream stays fp32; every block's input is add_rmsnorm(previous block's output).
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, b.ids, N, b.y, st));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.resid, 0, N * Hd * sizeof(float), I.stream), "residual clear"));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const GpuLayer& w = weights_.layers[l];
      KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.input_norm, N, Hd, eps, b.h, st));
      KILN_RETURN_IF_ERROR(attention_block(x, w, kv.layer_pages(l)).with_context("layer " + std::to_string(l) + " attention (GPU)"));
      KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.post_attention_norm, N, Hd, eps, b.h, st));
      KILN_RETURN_IF_ERROR(mlp_block(x, w).with_context("layer " + std::to_string(l) + " mlp (GPU)"));
    }
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, weights_.final_norm, N, Hd, eps, b.normed, st));
    if (keep_hidden) KILN_RETURN_IF_ERROR(bf16_to_f32(b.normed, N * Hd, b.hidden, st));
    // Logits only for the rows asked for (gathered with the embedding kernel, the normed states as the table).
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(b.normed, N, Hd, b.rows, R, b.row_states, st));
    return g.linear(b.row_states, R, Hd, weights_.lm_head.w, c.vocab_size, b.logits, DType::kF32, st);
  };

  if (graphs_ && N == sh.S) {
    const GraphKey key{sh.S, R, sh.max_blocks, sh.scores_kv, sh.splits, keep_hidden, I.scratch.base(), kv.layer_pages(0)};
    KILN_RETURN_IF_ERROR(I.graphs.run(key, I.stream, enqueue));
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
