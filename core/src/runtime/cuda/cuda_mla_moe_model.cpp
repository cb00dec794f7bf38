#include "runtime/cuda/cuda_mla_moe_model.h"

#include <algorithm>
#include <string>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/topk.h"
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

void CudaMlaMoeModel::set_step_profiling(bool on) { impl_->timer.enabled = on; }
std::vector<std::pair<std::string, double>> CudaMlaMoeModel::step_profile() const { return impl_->timer.totals(); }
int64_t CudaMlaMoeModel::profiled_steps() const { return impl_->timer.steps(); }
void CudaMlaMoeModel::clear_step_profile() { impl_->timer.clear(); }

size_t CudaMlaMoeModel::device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  return cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? total_b - free_b : 0;
}

size_t CudaMlaMoeModel::device_total_bytes() {
  size_t free_b = 0, total_b = 0;
  return cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? total_b : 0;
}

Status CudaMlaMoeModel::supports(const ModelConfig& c) {
  if (c.has_indexer() && c.q_lora_rank <= 0) return invalid_argument(c.source + ": the DSA indexer needs q_lora_rank > 0");
  if (c.has_indexer() && c.index_n_heads * c.index_head_dim > 8192)
    return unimplemented(c.source + ": the CUDA indexer takes index_n_heads · index_head_dim ≤ 8192");
  if (c.has_indexer() && (c.index_topk <= 0 || c.index_topk > kMaxTopK))
    return unimplemented(c.source + ": the CUDA indexer takes 1 ≤ index_topk ≤ " + std::to_string(kMaxTopK));
  if (c.qk_rope_head_dim > 0 && !c.rope.interleave)
    return unimplemented(c.source + ": rope_interleave = false is not supported by the CUDA runner (interleaved only)");
  if (c.hidden_size % 8 != 0 || c.moe_intermediate_size % 8 != 0)
    return unimplemented(c.source + ": the CUDA MoE kernels need hidden_size and moe_intermediate_size to be multiples of 8");
  return ok_status();
}

Result<std::shared_ptr<CudaMlaMoeModel>> CudaMlaMoeModel::create(const ModelConfig& c, const WeightSource* source,
                                                                 uint64_t seed, bool load_mtp) {
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
  KILN_ASSIGN_OR_RETURN(I.route_done, I.arena.allocate_array<unsigned>(1, "MoE gate + route counter"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(I.route_done, 0, sizeof(unsigned), I.stream), "MoE gate + route counter"));
  if (c.qk_rope_head_dim > 0) {
    const cpu::RopeConfig rope = kernel_rope_config(c);
    const std::vector<float> inv = cpu::rope_inv_freq(rope);
    I.rope_factor = static_cast<float>(cpu::rope_attention_factor(rope));
    KILN_ASSIGN_OR_RETURN(I.inv_freq, I.arena.allocate_array<float>(inv.size(), "rope inv_freq"));
    KILN_RETURN_IF_ERROR(
        cuda_ok(cudaMemcpy(I.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice), "inv_freq upload"));
  }
  KILN_ASSIGN_OR_RETURN(m->weights_, load_gpu_weights(c, source, I.arena, seed, I.s(), load_mtp));
  return m;
}

Result<std::unique_ptr<ModelRunner>> CudaMlaMoeModel::make_runner(int64_t num_blocks, int64_t block_size) {
  // KV pages in chunks of at most 1 GiB: one allocation per layer group rather than one huge block.
  auto arena = std::make_unique<DeviceArena>(size_t{1} << 30);
  KILN_ASSIGN_OR_RETURN(GpuKvPool pool, GpuKvPool::create(*arena, config_.num_hidden_layers, num_blocks, block_size,
                                                          config_.kv_lora_rank + config_.qk_rope_head_dim,
                                                          config_.has_indexer() ? config_.index_head_dim : 0));
  return std::unique_ptr<ModelRunner>(new CudaRunner(*this, std::move(arena), std::move(pool)));
}

Status CudaMlaMoeModel::forward(std::span<const SequenceStep> steps, const GpuKvPool& kv, StepOutput& out,
                                bool keep_hidden) {
  return run_step(-1, steps, nullptr, kv, out, keep_hidden);
}

Status CudaMlaMoeModel::mtp_forward(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                    const GpuKvPool& kv, StepOutput& out) {
  if (mtp_index < 0 || mtp_index >= num_mtp_layers())
    return out_of_range("MTP layer " + std::to_string(mtp_index) + " is not on the GPU (" +
                        std::to_string(num_mtp_layers()) + " uploaded)");
  if (!prev_hidden) return invalid_argument("MTP step without the hidden states it conditions on");
  return run_step(mtp_index, steps, prev_hidden, kv, out, true);
}

Status CudaMlaMoeModel::run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                 const GpuKvPool& kv, StepOutput& out, bool keep_hidden) {
  const ModelConfig& c = config_;
  Impl& I = *impl_;
  const StreamHandle st = I.s();
  const int64_t Hd = c.hidden_size, H = c.num_attention_heads;
  const GpuMtpLayer* mtp = mtp_index >= 0 ? &weights_.mtp[mtp_index] : nullptr;
  StepLayout& lay = I.layout;
  KILN_RETURN_IF_ERROR(build_step_layout(steps, kv, c, lay, out));
  StepShape sh;
  sh.N = lay.tokens(), sh.R = lay.logit_rows(), sh.S = static_cast<int64_t>(steps.size()), sh.max_blocks = lay.max_blocks;
  // The tensor-core decode kernel takes no DSA selection yet: DSA models attend through the reference kernel.
  sh.fast_attention = c.kv_lora_rank == kMlaLatentDim && c.qk_rope_head_dim == kMlaRopeDim && !c.has_indexer();
  // Up to kBatchInvariantMaxRows rows each row is split by its own length (batch invariance); past it the split
  // count follows the step's rows and longest context.
  sh.split_by_length = sh.N <= kBatchInvariantMaxRows;
  if (sh.fast_attention)
    // Split-by-length grids are rounded up to 16 splits (the extra ones are empty), so a growing context
    // re-captures the step's graph every 1,024 keys rather than every 64.
    sh.splits = sh.split_by_length ? static_cast<int>((mla_decode_length_splits(lay.max_kv) + 15) / 16 * 16)
                                   : mla_decode_num_splits(sh.N, H, lay.max_kv, I.sm_count);
  sh.scores_kv = sh.fast_attention ? 0 : round_up_pow2(lay.max_kv, 16);
  sh.attn_width = c.has_indexer() ? std::max(sh.scores_kv, c.index_topk) : sh.scores_kv;
  sh.mtp = mtp != nullptr;
  if (!lay.prefill.empty())
    sh.prefill_workspace = mla_prefill_workspace_bytes(
        static_cast<int64_t>(lay.prefill.size()), lay.prefill_keys,
        {H, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank});
  const int64_t N = sh.N, R = sh.R;
  // The MTP layer's hidden output is its residual stream, read straight from b.resid.
  const bool normed_hidden = keep_hidden && !mtp;

  StepBuffers b{};
  I.scratch.begin(true);
  carve_step_buffers(c, sh, normed_hidden, I.scratch, b);
  KILN_RETURN_IF_ERROR(I.scratch.ensure(I.scratch.offset()));
  I.scratch.begin(false);
  carve_step_buffers(c, sh, normed_hidden, I.scratch, b);
  KILN_RETURN_IF_ERROR(upload_step_layout(lay, b, I.uploads, I.stream));
  if (mtp)
    KILN_RETURN_IF_ERROR(cuda_ok(
        cudaMemcpyAsync(b.prev, prev_hidden, N * Hd * sizeof(float), cudaMemcpyHostToDevice, I.stream), "MTP hidden upload"));

  const StepContext x{c, I, sh, b, kv.block_size(), lay.prefill};
  CublasGemm& g = *I.gemm;
  const float eps = static_cast<float>(c.rms_norm_eps);
  StepTimer& timer = I.timer;
  // A layer's MLP block ends with the residual add + RMSNorm that makes the next block's input (`next`: the next
  // layer's input norm into b.h, or the final / head norm into b.normed) — on MoE layers fused into the combine
  // kernel. So a layer's own input norm runs only where no block precedes it (`input_normed` false).
  auto decoder_layer = [&](const GpuLayer& w, int64_t kv_layer, int64_t name, bool input_normed,
                           const NextNorm& next) -> Status {
    if (!input_normed) {
      KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.input_norm, N, Hd, eps, b.h, st));
      timer.mark("residual add + RMSNorm");
    }
    KILN_RETURN_IF_ERROR(attention_block(x, w, kv.layer_pages(kv_layer), kv.index_keys(kv_layer))
                             .with_context("layer " + std::to_string(name) + " attention (GPU)"));
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.resid, w.post_attention_norm, N, Hd, eps, b.h, st));
    timer.mark("residual add + RMSNorm");
    return mlp_block(x, w, &next).with_context("layer " + std::to_string(name) + " mlp (GPU)");
  };
  // Everything from the embedding to the logits, on the stream: run directly, or captured into a graph.
  // The residual stream stays fp32; every block's input is add_rmsnorm(previous block's output).
  auto enqueue_trunk = [&]() -> Status {
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, b.ids, N, b.y, st));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.resid, 0, N * Hd * sizeof(float), I.stream), "residual clear"));
    timer.mark("embedding");
    const int64_t layers = c.num_hidden_layers;
    for (int64_t l = 0; l < layers; ++l) {
      const NextNorm next = l + 1 < layers ? NextNorm{weights_.layers[l + 1].input_norm, eps, b.h}
                                           : NextNorm{weights_.final_norm, eps, b.normed};
      KILN_RETURN_IF_ERROR(decoder_layer(weights_.layers[l], l, l, l > 0, next));
    }
    return ok_status();
  };
  // x = eh_proj(cat(enorm(embed(t)), hnorm(h))) in fp32 straight into the residual stream (the first
  // add_rmsnorm then adds a zero block output), one decoder layer, the head norm.
  auto enqueue_mtp = [&]() -> Status {
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.y, 0, N * Hd * sizeof(uint16_t), I.stream), "MTP zero block"));
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, b.ids, N, b.h, st));
    KILN_RETURN_IF_ERROR(rmsnorm_bf16(b.h, mtp->enorm, N, Hd, eps, b.normed, st));
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.prev, mtp->hnorm, N, Hd, eps, b.h, st));  // prev += 0: unchanged
    const size_t row = Hd * sizeof(uint16_t);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(b.cat, 2 * row, b.normed, row, row, N, cudaMemcpyDeviceToDevice, I.stream),
                                 "MTP concat"));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(b.cat + Hd, 2 * row, b.h, row, row, N, cudaMemcpyDeviceToDevice, I.stream),
                                 "MTP concat"));
    KILN_RETURN_IF_ERROR(g.linear(b.cat, N, 2 * Hd, mtp->eh_proj.w, Hd, b.resid, DType::kF32, st));
    return decoder_layer(mtp->layer, mtp_index, c.num_hidden_layers + mtp_index, false,
                         NextNorm{mtp->head_norm, eps, b.normed});
  };
  auto enqueue = [&]() -> Status {
    KILN_RETURN_IF_ERROR(mtp ? enqueue_mtp() : enqueue_trunk());
    if (normed_hidden) KILN_RETURN_IF_ERROR(bf16_to_f32(b.normed, N * Hd, b.hidden, st));
    // Logits only for the rows asked for (gathered with the embedding kernel, the normed states as the table).
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(b.normed, N, Hd, b.rows, R, b.row_states, st));
    const GpuLinear& head = mtp ? mtp->head : weights_.lm_head;
    KILN_RETURN_IF_ERROR(g.linear(b.row_states, R, Hd, head.w, c.vocab_size, b.logits, DType::kF32, st));
    timer.mark("final norm + lm_head");
    return ok_status();
  };

  if (graphs_ && N == sh.S) {
    const GraphKey key{mtp_index,  sh.S,        R, sh.max_blocks, sh.scores_kv, sh.splits, keep_hidden, I.scratch.base(),
                       kv.layer_pages(0)};
    KILN_RETURN_IF_ERROR(I.graphs.run(key, I.stream, enqueue));
  } else {
    timer.begin(I.stream);
    const Status enqueued = enqueue();
    if (!enqueued.ok()) {
      timer.finish();
      return enqueued;
    }
  }
  if (keep_hidden) {
    out.hidden.resize(N * Hd);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out.hidden.data(), mtp ? b.resid : b.hidden, N * Hd * sizeof(float),
                                                 cudaMemcpyDeviceToHost, I.stream),
                                 "hidden"));
  }
  out.logits.resize(R * c.vocab_size);
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out.logits.data(), b.logits, R * c.vocab_size * sizeof(float),
                                               cudaMemcpyDeviceToHost, I.stream),
                               "logits"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(I.stream), "forward step"));
  timer.finish();
  return ok_status();
}

}  // namespace kiln::cuda
