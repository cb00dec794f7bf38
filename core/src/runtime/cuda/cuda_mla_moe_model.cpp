#include "runtime/cuda/cuda_mla_moe_model.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/half_float.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/topk.h"
#include "kiln/drafter.h"
#include "model/batch_invariance.h"
#include "model/rope_setup.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_parallel_instance.h"
#include "parallel/collective_capture.h"
#include "runtime/cuda/batch_invariant_bound.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::cuda {
namespace {

// A layer-major step's tiles: rows [row, row + n) of the step, boundaries at positions that are multiples of `tile`.
struct PrefillTile {
  int64_t row = 0, n = 0;
};
std::vector<PrefillTile> prefill_tiles(int64_t start, int64_t rows, int64_t tile) {
  std::vector<PrefillTile> tiles;
  for (int64_t r = 0; r < rows;) {
    const int64_t end = std::min(start + rows, ((start + r) / tile + 1) * tile) - start;
    tiles.push_back({r, end - r});
    r = end;
  }
  return tiles;
}

}  // namespace

CudaMlaMoeModel::CudaMlaMoeModel(ModelConfig config, CudaDeviceContext& dev)
    : config_(std::move(config)), impl_(std::make_unique<Impl>(dev)), prefill_tile_rows_(cuda_prefill_tile_rows()) {}
CudaMlaMoeModel::~CudaMlaMoeModel() = default;

Device CudaMlaMoeModel::device() const { return impl_->dev.device(); }
DeviceContext& CudaMlaMoeModel::device_context() { return impl_->dev; }
void CudaMlaMoeModel::set_step_profiling(bool on) { impl_->timer.enabled = on; }
std::vector<std::pair<std::string, double>> CudaMlaMoeModel::step_profile() const { return impl_->timer.totals(); }
int64_t CudaMlaMoeModel::profiled_steps() const { return impl_->timer.steps(); }
void CudaMlaMoeModel::clear_step_profile() { impl_->timer.clear(); }

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

Status CudaMlaMoeModel::supports_decode_context(const ModelConfig& c, int tensor, int decode_context) {
  if (decode_context <= 1) return ok_status();
  const std::string what = "parallel.decode_context = " + std::to_string(decode_context) + " on CUDA: ";
  if (decode_context != tensor)
    return unimplemented(what + "the CUDA runner splits the KV cache over the whole tensor-parallel group (set "
                         "decode_context = parallel.tensor = " + std::to_string(tensor) + ", or run on CPU ranks)");
  if (c.has_indexer())
    return unimplemented(what + c.model_type + "'s DSA indexer keys and selection are not split over CUDA ranks yet "
                         "(decode-context parallelism of DSA models runs on CPU ranks)");
  return ok_status();
}

Result<std::unique_ptr<CudaMlaMoeModel>> CudaMlaMoeModel::create_rank(const ModelConfig& c, const BuildContext& ctx) {
  const int world = ctx.collective->world_size(), rank = ctx.collective->rank();
  const std::string where = "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world) + " on CUDA";
  KILN_RETURN_IF_ERROR(check_rank_process_group(ctx));
  KILN_RETURN_IF_ERROR(supports_decode_context(c, world, ctx.decode_context));
  // ctx.load_mtp: the next-n layers are sharded as the trunk's layers are (the sharded source splits their heads,
  // MLP columns, experts and shared_head.head's vocabulary rows; enorm, hnorm and eh_proj stay whole), and an MTP
  // step runs the trunk's building blocks, so it meets the other ranks in the same collectives in the same order:
  // the embedding's exclusive sum, each block's gathers and sums, the head's logits gather. Every rank runs every
  // MTP step: RankLeaderInstance forwards it (a chained step's device tokens staged through rank 0's host).
  KILN_RETURN_IF_ERROR(check_tensor_parallel_units(c, world));
  const TensorShard shard{rank, world};
  BuildContext rank_ctx = ctx;
  auto source = std::make_unique<ShardedWeightSource>(*ctx.source, c, shard);
  rank_ctx.source = source.get();
  auto m = create(c, rank_ctx, shard);
  if (!m.ok()) return m.status().with_context(where);
  (*m)->rank_source_ = std::move(source);
  if (ctx.decode_context > 1) (*m)->impl_->context = DecodeContextShard{rank, ctx.decode_context};
  return m;
}

Result<std::unique_ptr<CudaMlaMoeModel>> CudaMlaMoeModel::create(const ModelConfig& c, const BuildContext& ctx,
                                                                 TensorShard shard) {
  KILN_RETURN_IF_ERROR(supports(c));
  auto* dev = dynamic_cast<CudaDeviceContext*>(ctx.device);
  if (!dev) return failed_precondition("the CUDA model needs the core's CUDA device context");
  if (!ctx.layout->device().is_cuda())
    return failed_precondition("the KV layout was made for " + ctx.layout->device().to_string() + ", not CUDA");
  std::unique_ptr<CudaMlaMoeModel> m(new CudaMlaMoeModel(c, *dev));
  Impl& I = *m->impl_;
  I.layout = ctx.layout;
  I.collective = ctx.collective;
  I.shard = shard;
  I.sm_count = dev->multiprocessor_count();
  KILN_ASSIGN_OR_RETURN(void* done, dev->allocate(sizeof(unsigned), "MoE gate + route counter"));
  I.route_done = static_cast<unsigned*>(done);
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(I.route_done, 0, sizeof(unsigned), I.stream), "MoE gate + route counter"));
  if (c.qk_rope_head_dim > 0) {
    const cpu::RopeConfig rope = kernel_rope_config(c);
    const std::vector<float> inv = cpu::rope_inv_freq(rope);
    I.rope_factor = static_cast<float>(cpu::rope_attention_factor(rope));
    KILN_ASSIGN_OR_RETURN(void* p, dev->allocate(inv.size() * sizeof(float), "rope inv_freq"));
    I.inv_freq = static_cast<float*>(p);
    KILN_RETURN_IF_ERROR(dev->copy(I.inv_freq, inv.data(), inv.size() * sizeof(float), true));
  }
  // A rank's source is a ShardedWeightSource over the checkpoint, which is what the shared expert is read from whole.
  const WeightSource* whole = nullptr;
  if (const auto* sharded = dynamic_cast<const ShardedWeightSource*>(ctx.source)) whole = &sharded->stored();
  KILN_ASSIGN_OR_RETURN(m->weights_, load_gpu_weights(c, *ctx.source, *ctx.format, *dev, ctx.load_mtp, shard, whole));
  return m;
}

Status CudaMlaMoeModel::run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                 const CacheViews& caches, const StepOptions& options, std::vector<int64_t>& first_row) {
  const ModelConfig& c = config_;
  Impl& I = *impl_;
  const StreamHandle st = I.s();
  const int64_t Hd = c.hidden_size, H = c.num_attention_heads;
  const GpuMtpLayer* mtp = mtp_index >= 0 ? &weights_.mtp[mtp_index] : nullptr;
  if (!caches.layout || caches.block_size <= 0) return invalid_argument("the CUDA model got no cache memory");
  for (int tap : options.tap_layers)
    if (tap != kTapFinalNormed && (tap < 0 || tap >= c.num_hidden_layers))
      return out_of_range("tap layer " + std::to_string(tap) + " does not exist (" + std::to_string(c.num_hidden_layers) +
                          " layers)");
  StepLayout& lay = I.layout_host;
  if (I.context.split() && caches.block_size != I.layout->geometry().block_size * I.context.world)
    return failed_precondition("parallel.decode_context = " + std::to_string(I.context.world) +
                               ": the scheduler's blocks must hold kv.block_size × decode_context = " +
                               std::to_string(I.layout->geometry().block_size * I.context.world) + " tokens, got " +
                               std::to_string(caches.block_size));
  KILN_RETURN_IF_ERROR(build_step_layout(steps, caches, c, lay, first_row, I.context));
  // Layer-major prefill (set_prefill_tile_rows): a lone prompt chunk longer than a tile, tiles on whole KV blocks (a
  // tile's first key must start a block: mla_prefill_attention gathers from there). Not under split context, whose
  // prefill gathers every rank's rows through collectives sized per step.
  const int64_t tile = effective_prefill_tile_rows(prefill_tile_rows_, caches.block_size);
  const bool tiled = !mtp && tile > 0 && steps.size() == 1 && lay.prefill.size() == 1 && lay.tokens() > tile &&
                     !I.context.split();
  const std::vector<PrefillTile> tiles =
      tiled ? prefill_tiles(steps[0].start_position, lay.tokens(), tile) : std::vector<PrefillTile>{};
  StepShape sh;
  sh.N = tiled ? tile : lay.tokens(), sh.full_rows = tiled ? lay.tokens() : 0;
  sh.R = lay.logit_rows(), sh.S = static_cast<int64_t>(steps.size()), sh.max_blocks = lay.max_blocks;
  sh.max_kv = lay.max_kv;
  // Up to kBatchInvariantMaxRows rows each row's attention must not depend on the others (see that constant).
  // Split context: each rank attends every head over its own tokens (kv_len counts those).
  sh.attend_shape = {sh.N, H, I.context.split() ? lay.max_local_kv : lay.max_kv, c.has_indexer() ? c.index_topk : 0,
                     sh.N <= kBatchInvariantMaxRows, I.sm_count};
  sh.attend = I.layout->plan_attend(sh.attend_shape);
  sh.scores_kv = c.has_indexer() ? round_up_pow2(lay.max_kv, 16) : 0;
  sh.mtp = mtp != nullptr;
  sh.shard = I.shard;
  sh.context = I.context, sh.context_rows = lay.context_rows;
  if (!lay.prefill.empty())
    sh.prefill_workspace = mla_prefill_workspace_bytes(
        static_cast<int64_t>(lay.prefill.size()), lay.prefill_keys,
        {H, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank});
  for (const GpuLayer& l : weights_.layers)
    if (l.experts) sh.expert_workspace = std::max(sh.expert_workspace, l.experts->workspace_bytes(sh.N, static_cast<int>(c.num_experts_per_tok)));
  if (mtp && mtp->layer.experts)
    sh.expert_workspace = std::max(sh.expert_workspace, mtp->layer.experts->workspace_bytes(sh.N, static_cast<int>(c.num_experts_per_tok)));
  const std::vector<int>& taps = mtp ? std::vector<int>{} : options.tap_layers;
  sh.taps = static_cast<int64_t>(std::count_if(taps.begin(), taps.end(), [](int t) { return t >= 0; }));
  // The MTP layer's hidden output is its residual stream, read straight from b.resid.
  sh.want_hidden = !mtp && (options.want_hidden || std::count(taps.begin(), taps.end(), kTapFinalNormed) > 0);
  // N: rows a block runs at once (a tile's, in a layer-major step); F: the step's rows.
  const int64_t N = sh.N, R = sh.R, F = std::max(sh.full_rows, N);

  StepBuffers& b = I.buffers;
  b = StepBuffers{};
  I.scratch.begin(true);
  carve_step_buffers(c, sh, I.scratch, b);
  KILN_RETURN_IF_ERROR(I.scratch.ensure(I.scratch.offset()));
  I.scratch.begin(false);
  carve_step_buffers(c, sh, I.scratch, b);
  I.shape = sh;
  KILN_RETURN_IF_ERROR(upload_step_layout(lay, b, I.uploads, I.stream));
  KILN_RETURN_IF_ERROR(copy_device_tokens(steps, b.ids, I.stream));
  if (mtp)
    KILN_RETURN_IF_ERROR(cuda_ok(
        cudaMemcpyAsync(b.prev, prev_hidden, N * Hd * sizeof(float), cudaMemcpyDefault, I.stream), "MTP hidden rows"));
  // The modality path: media rows replace their placeholder tokens' embeddings (uploaded after the gather).
  std::vector<std::pair<int64_t, const MediaRows*>> media;
  {
    int64_t row = 0;
    for (const SequenceStep& s : steps) {
      for (const MediaRows& m : s.media) media.emplace_back(row + m.first_row, &m);
      row += static_cast<int64_t>(s.tokens.size());
    }
  }
  if (!media.empty() && mtp) return invalid_argument("an MTP step takes no media rows");

  const StepContext x{c, I, sh, b, caches.block_size, lay.prefill, nullptr};
  const float eps = static_cast<float>(c.rms_norm_eps);
  StepTimer& timer = I.timer;
  // Copies `rows` rows of layer `layer`'s output (the residual stream) into each of its tap slots (a layer may be
  // asked for twice).
  auto copy_taps = [&](int layer, int64_t rows) -> Status {
    int64_t i = 0;
    for (int t : taps) {
      if (t == layer)
        KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(b.taps + i * F * Hd, b.resid, rows * Hd * sizeof(float),
                                                     cudaMemcpyDeviceToDevice, I.stream),
                                     "layer tap"));
      if (t >= 0) ++i;
    }
    return ok_status();
  };
  // A layer's MLP block ends with the residual add + RMSNorm that makes the next block's input (`next`: the next
  // layer's input norm into b.h, or the final / head norm into b.normed) — on MoE layers fused into the combine
  // kernel. So a layer's own input norm runs only where no block precedes it (`input_normed` false).
  // Over the rows of `xc` (the step's, or a layer-major step's tile).
  auto decoder_layer = [&](const StepContext& xc, const GpuLayer& w, int64_t kv_layer, bool input_normed,
                           const NextNorm& next) -> Status {
    const StepBuffers& xb = xc.b;
    const int64_t n = xc.shape.N;
    if (!input_normed) {
      KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(xb.y, xb.resid, w.input_norm, n, Hd, eps, xb.h, st));
      timer.mark("residual add + RMSNorm");
    }
    KILN_RETURN_IF_ERROR(attention_block(xc, w, caches.entry(kv_layer, 0), caches.entry(kv_layer, 1))
                             .with_context("layer " + std::to_string(kv_layer) + " attention (GPU)"));
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(xb.y, xb.resid, w.post_attention_norm, n, Hd, eps, xb.h, st));
    timer.mark("residual add + RMSNorm");
    return mlp_block(xc, w, &next).with_context("layer " + std::to_string(kv_layer) + " mlp (GPU)");
  };
  // Embedding rows `ids` (n of them) into `out`: under tensor parallelism each rank gathers its vocabulary rows
  // (zero rows for the others' ids) and the group sums them, each row's one owner giving its exact value.
  auto embed_rows = [&](const int32_t* ids, int64_t n, uint16_t* out) -> Status {
    if (!I.sharded()) return embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, ids, n, out, st);
    return rank_embedding_rows(I, c, weights_.embed_tokens, ids, n, b.ids_local, out);
  };
  // Media rows over their placeholders' embeddings in rows [r0, r0 + n) of the step (out: row r0's), rounded to
  // bf16 as the table's rows are. From pageable memory: the copy has taken the rows when it returns (such steps are
  // prompt chunks, never graphed).
  auto place_media = [&](int64_t r0, int64_t n, uint16_t* out) -> Status {
    for (const auto& [row, m] : media) {
      const int64_t lo = std::max(row, r0), hi = std::min(row + m->count, r0 + n);
      if (lo >= hi) continue;
      media_rows_.resize(static_cast<size_t>((hi - lo) * Hd));
      const float* src = m->embeddings + (lo - row) * Hd;
      for (int64_t i = 0; i < (hi - lo) * Hd; ++i) media_rows_[i] = cpu::float_to_bf16(src[i]);
      KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out + (lo - r0) * Hd, media_rows_.data(), media_rows_.size() * 2,
                                                   cudaMemcpyHostToDevice, I.stream),
                                   "media rows"));
    }
    return ok_status();
  };
  // Everything from the embedding to the logits, on the stream: run directly, or captured into a graph.
  // The residual stream stays fp32; every block's input is add_rmsnorm(previous block's output).
  auto enqueue_trunk = [&]() -> Status {
    KILN_RETURN_IF_ERROR(embed_rows(b.ids, N, b.y));
    KILN_RETURN_IF_ERROR(place_media(0, N, b.y));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.resid, 0, N * Hd * sizeof(float), I.stream), "residual clear"));
    timer.mark("embedding");
    const int64_t layers = c.num_hidden_layers;
    for (int64_t l = 0; l < layers; ++l) {
      const NextNorm next = l + 1 < layers ? NextNorm{weights_.layers[l + 1].input_norm, eps, b.h}
                                           : NextNorm{weights_.final_norm, eps, b.normed};
      KILN_RETURN_IF_ERROR(decoder_layer(x, weights_.layers[l], l, l > 0, next));
      // A tap of layer l is its output: the residual stream once the next block's add has run (the MLP block ends
      // with it), so the copy follows the block.
      KILN_RETURN_IF_ERROR(copy_taps(static_cast<int>(l), N));
    }
    return ok_status();
  };
  // The same trunk over a lone prompt chunk in tiles, layer by layer (set_prefill_tile_rows): each tile a StepContext
  // of its own over its rows of the step's full-row arrays (ids, positions, slots, residual stream, block inputs,
  // final-normed rows) and the one-tile buffers for the rest; its attention keeps the layer's gathered and expanded
  // keys in the shared prefill workspace for the tiles after it. Every row goes through the kernels the untiled step
  // runs (the tiles' row counts pick their GEMM shapes, as chunk steps of those sizes would).
  auto enqueue_tiled_trunk = [&]() -> Status {
    const size_t count = tiles.size();
    const int64_t s0 = steps[0].start_position, capacity = lay.prefill_keys;
    std::vector<StepShape> shapes(count, sh);
    std::vector<StepBuffers> bufs(count, b);
    std::vector<MlaPrefillSequence> seqs(count);
    std::vector<StepContext> xs;
    xs.reserve(count);
    for (size_t t = 0; t < count; ++t) {
      const int64_t r0 = tiles[t].row, n = tiles[t].n;
      shapes[t].N = n, shapes[t].full_rows = 0;
      StepBuffers& tb = bufs[t];
      tb.ids += r0, tb.query_seq += r0, tb.kv_len += r0, tb.positions += r0, tb.slots += r0;
      tb.resid += r0 * Hd, tb.h += r0 * Hd, tb.normed += r0 * Hd;
      seqs[t] = MlaPrefillSequence{0, n, s0 + r0 + n, lay.prefill[0].table_row};
      xs.push_back(StepContext{c, I, shapes[t], tb, caches.block_size, {&seqs[t], 1}, nullptr, capacity,
                               r0 > 0 ? s0 + r0 : 0});
    }
    const int64_t layers = c.num_hidden_layers;
    for (int64_t l = 0; l < layers; ++l) {
      for (size_t t = 0; t < count; ++t) {
        const StepBuffers& tb = bufs[t];
        const int64_t r0 = tiles[t].row, n = tiles[t].n;
        if (l == 0) {  // the tile's embedding rows (media rows over their placeholders) into b.y, as the untiled step
          KILN_RETURN_IF_ERROR(embed_rows(tb.ids, n, b.y));
          KILN_RETURN_IF_ERROR(place_media(r0, n, b.y));
          KILN_RETURN_IF_ERROR(
              cuda_ok(cudaMemsetAsync(tb.resid, 0, n * Hd * sizeof(float), I.stream), "residual clear"));
          timer.mark("embedding");
        }
        const NextNorm next = l + 1 < layers ? NextNorm{weights_.layers[l + 1].input_norm, eps, tb.h}
                                             : NextNorm{weights_.final_norm, eps, tb.normed};
        KILN_RETURN_IF_ERROR(decoder_layer(xs[t], weights_.layers[l], l, l > 0, next)
                                 .with_context("prompt tile " + std::to_string(t)));
      }
      KILN_RETURN_IF_ERROR(copy_taps(static_cast<int>(l), F));
    }
    return ok_status();
  };
  // x = eh_proj(cat(enorm(embed(t)), hnorm(h))) in fp32 straight into the residual stream (the first
  // add_rmsnorm then adds a zero block output), one decoder layer, the head norm.
  auto enqueue_mtp = [&]() -> Status {
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemsetAsync(b.y, 0, N * Hd * sizeof(uint16_t), I.stream), "MTP zero block"));
    KILN_RETURN_IF_ERROR(embed_rows(b.ids, N, b.h));
    KILN_RETURN_IF_ERROR(rmsnorm_bf16(b.h, mtp->enorm, N, Hd, eps, b.normed, st));
    KILN_RETURN_IF_ERROR(add_rmsnorm_bf16(b.y, b.prev, mtp->hnorm, N, Hd, eps, b.h, st));  // prev += 0: unchanged
    const size_t row = Hd * sizeof(uint16_t);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(b.cat, 2 * row, b.normed, row, row, N, cudaMemcpyDeviceToDevice, I.stream),
                                 "MTP concat"));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(b.cat + Hd, 2 * row, b.h, row, row, N, cudaMemcpyDeviceToDevice, I.stream),
                                 "MTP concat"));
    KILN_RETURN_IF_ERROR(run_linear(x, *mtp->eh_proj, b.cat, N, b.resid, DType::kF32));
    return decoder_layer(x, mtp->layer, c.num_hidden_layers + mtp_index, false, NextNorm{mtp->head_norm, eps, b.normed});
  };
  auto enqueue = [&]() -> Status {
    KILN_RETURN_IF_ERROR(mtp ? enqueue_mtp() : tiled ? enqueue_tiled_trunk() : enqueue_trunk());
    if (sh.want_hidden) KILN_RETURN_IF_ERROR(bf16_to_f32(b.normed, F * Hd, b.hidden, st));
    // Logits only for the rows asked for (gathered with the embedding kernel, the normed states as the table).
    KILN_RETURN_IF_ERROR(embedding_gather_bf16(b.normed, F, Hd, b.rows, R, b.row_states, st));
    const Linear& head = mtp ? *mtp->head : *weights_.lm_head;
    if (I.sharded()) {  // this rank's vocabulary rows, then every rank's gathered
      KILN_RETURN_IF_ERROR(run_linear(x, head, b.row_states, R, b.logits_local, DType::kF32));
      KILN_RETURN_IF_ERROR(gather_units(x, b.logits_local, R, c.vocab_size, 1, DType::kF32, b.logits));
    } else {
      KILN_RETURN_IF_ERROR(run_linear(x, head, b.row_states, R, b.logits, DType::kF32));
    }
    timer.mark("final norm + lm_head");
    return ok_status();
  };

  // A step whose rows all attend in the absorbed form (no prompt chunk through the expanded kernel, no media) is
  // described entirely by its uploaded layout and its shape, so it can replay a graph. Decode steps and verification
  // passes (every sequence's rows with all their logits: t_L and its drafts) do, as they recur shape for shape. A
  // drafter's first next-n step over the accepted rows runs directly: capturing its many shapes cost more than it
  // saved on the H200 (kiln ab, tiny model, c1 K5: 1.34x with them captured on recurrence, 1.41x without).
  const GraphKey key{mtp_index,      sh.S, R, sh.max_blocks, sh.scores_kv, tap_key(taps), sh.attend, sh.want_hidden,
                     I.scratch.base(), caches.entry(0, 0), 0, N};
  const bool verification = std::all_of(steps.begin(), steps.end(), [](const SequenceStep& s) { return s.all_logits; });
  // A collective that meets through the host (collective_capture.h) cannot be captured: such ranks run every step
  // directly.
  const bool capturable = !I.sharded() || collective_capturable(*I.collective);
  if (graphs_ && capturable && lay.prefill.empty() && media.empty() && (N == sh.S || verification)) {
    KILN_RETURN_IF_ERROR(I.graphs.run(key, I.stream, enqueue));
  } else {
    timer.begin(I.stream);
    const Status enqueued = enqueue();
    if (!enqueued.ok()) {
      timer.finish();
      return enqueued;
    }
  }
  return ok_status();
}

Status CudaMlaMoeModel::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                             const CacheViews& caches, const StepOptions& options, StepOutput& out) {
  Impl& I = *impl_;
  if (!select.empty() && select.size() != steps.size())
    return invalid_argument("token selection has " + std::to_string(select.size()) + " entries for " +
                            std::to_string(steps.size()) + " steps");
  KILN_RETURN_IF_ERROR(run_step(-1, steps, nullptr, caches, options, out.first_row));
  const StepBuffers& b = I.buffers;
  const int64_t N = std::max(I.shape.full_rows, I.shape.N), R = I.shape.R, Hd = config_.hidden_size;
  const int64_t V = config_.vocab_size;
  out.taps.clear();
  for (int64_t t = 0, i = 0; t < static_cast<int64_t>(options.tap_layers.size()); ++t) {
    const int layer = options.tap_layers[t];
    float* data = layer == kTapFinalNormed ? b.hidden : b.taps + (i++) * N * Hd;
    out.taps.push_back(TensorView::contiguous(data, DType::kF32, {N, Hd}, I.dev.device()));
  }
  out.hidden.clear();
  if (options.want_hidden) {
    out.hidden.resize(N * Hd);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out.hidden.data(), b.hidden, N * Hd * sizeof(float),
                                                 cudaMemcpyDeviceToHost, I.stream), "hidden"));
  }
  out.logits.clear();
  if (options.want_logits) {
    out.logits.resize(R * V);
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(out.logits.data(), b.logits, R * V * sizeof(float),
                                                 cudaMemcpyDeviceToHost, I.stream), "logits"));
  }
  // Selection on the device: only ids come back (it waits for the stream).
  if (select.empty()) {
    KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(I.stream), "forward step"));
    out.tokens.assign(steps.size(), {});
    out.accepted.assign(steps.size(), 0);
  } else {
    KILN_RETURN_IF_ERROR(selection_.select(b.logits, V, out.first_row, select, I.stream, out));
  }
  I.timer.finish();
  return ok_status();
}

BatchInvariance CudaMlaMoeModel::batch_invariance() const {
  BatchInvariantBound b;
  b.add_absorption(config_);
  for (const GpuLayer& l : weights_.layers) b.add(l);
  return b.bound(weights_.lm_head.get());
}

Status CudaMlaMoeModel::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                 const CacheViews& caches, MtpStepOutput& out) {
  if (layer < 0 || layer >= num_mtp_layers())
    return out_of_range("MTP layer " + std::to_string(layer) + " is not on the GPU (" + std::to_string(num_mtp_layers()) +
                        " uploaded)");
  if (!hidden) return invalid_argument("MTP step without the hidden states it conditions on");
  StepOptions options;
  KILN_RETURN_IF_ERROR(run_step(layer, steps, hidden, caches, options, out.first_row));
  // Left on the device for the drafter; the stream orders its next launches after this step.
  out.logits = impl_->buffers.logits;
  out.hidden = impl_->buffers.resid;
  if (impl_->timer.active()) {
    KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(impl_->stream), "MTP step"));
    impl_->timer.finish();
  }
  return ok_status();
}

Status CudaMlaMoeModel::embed(const int32_t* ids, int64_t n, TensorView out) {
  if (!out.device.is_cuda() || out.dtype != DType::kBF16 || out.numel() != n * config_.hidden_size)
    return invalid_argument("CUDA embedding rows go to device bf16 [n, hidden]");
  Impl& I = *impl_;
  const int64_t Hd = config_.hidden_size;
  if (!I.sharded())
    return embedding_gather_bf16(weights_.embed_tokens, config_.vocab_size, Hd, ids, n, out.as<uint16_t>(), I.s());
  // As a step's embedding (run_step's embed_rows), into scratch apart from the step's buffers (a drafter may still
  // read those). Every rank runs it (RankLeaderInstance forwards the call).
  KILN_ASSIGN_OR_RETURN(char* scratch, drafter_scratch_.get(I.dev, static_cast<size_t>(n) * sizeof(int32_t),
                                                            "tensor-parallel drafter scratch"));
  return rank_embedding_rows(I, config_, weights_.embed_tokens, ids, n, reinterpret_cast<int32_t*>(scratch),
                             out.as<uint16_t>());
}

Status CudaMlaMoeModel::lm_head(const TensorView& hidden, float* logits) {
  if (!hidden.device.is_cuda() || hidden.dtype != DType::kBF16 || hidden.dim(-1) != config_.hidden_size)
    return invalid_argument("the CUDA lm_head takes device bf16 [n, hidden]");
  Impl& I = *impl_;
  const int64_t n = hidden.numel() / config_.hidden_size, V = config_.vocab_size;
  LinearRun r;
  r.x = hidden;
  if (!I.sharded()) {
    r.y = TensorView::contiguous(logits, DType::kF32, {n, V}, I.dev.device());
    return weights_.lm_head->run(r, I.dev.stream());
  }
  // As a step's logits (copies only, so each value is its owner's), in scratch apart from the step's buffers.
  KILN_ASSIGN_OR_RETURN(char* scratch, drafter_scratch_.get(I.dev, rank_head_scratch_bytes(I.shard, n, V),
                                                            "tensor-parallel drafter scratch"));
  return rank_head_logits(I, config_, *weights_.lm_head, hidden, scratch, logits);
}

Status CudaMlaMoeModel::sample_drafts(const DraftSampleRequest& r) {
  return selection_.sample_drafts(r, config_.vocab_size, impl_->stream);
}

}  // namespace kiln::cuda
