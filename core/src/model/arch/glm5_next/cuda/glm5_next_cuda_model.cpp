#include "model/arch/glm5_next/cuda/glm5_next_cuda_model.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "kernels/cpu/half_float.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/kda.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/pooled_indexer.h"
#include "kernels/cuda/topk.h"
#include "kiln/drafter.h"
#include "model/arch/glm5_next/cuda/glm5_next_glue_kernels.h"
#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/tensor_parallel_instance.h"
#include "parallel/collective_capture.h"
#include "runtime/cuda/batch_invariant_bound.h"
#include "runtime/cuda/cuda_model_step.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::glm5_next::cuda {

namespace kc = kiln::cuda;

// The indexer key's LayerNorm eps (nn.LayerNorm(index_head_dim, eps=1e-6) in transformers).
constexpr float kIndexerNormEps = 1e-6f;

// One launch of the KDA kernels over consecutive sequences of the step: decode-shaped ones of equal length
// (kda_decode's [seqs, tokens] grid), or prompt chunks (kda_conv_prefill + kda_prefill over cu_seqlens).
struct KdaGroup {
  bool decode = true;
  int64_t first_seq = 0, seqs = 0, first_token = 0;
  int64_t tokens = 0;      // decode: per sequence; prefill: in all
  int64_t cu_offset = -1;  // prefill: where its cu_seqlens start in Plan::ints
};

// A sequence's part in the pooled indexer: its queries, and its complete pools (keys at pool_offset in the step's
// gathered pool-key rows). The score and select launches take `bound` pools, num_pools rounded up to a whole
// bucket: pools past a query's position score −inf, which ranks below every candidate, so the extra ones change
// nothing, and a decode step's captured graph then stays valid for kPoolBucket pools (4,096 tokens at pools of 16)
// instead of being captured again at every completed pool.
struct SeqPools {
  int64_t first_token = 0, len = 0, start = 0, num_pools = 0, bound = 0, pool_offset = 0;
};
constexpr int64_t kPoolBucket = 256;

struct Glm5NextCudaModel::Plan {
  std::vector<int32_t> ints;  // uploaded once per step (offsets below)
  int64_t slot_off = 0, num_pools_off = 0, pool_offset_off = 0, new_first_off = 0, new_dst_off = 0, new_id_off = 0;
  std::vector<KdaGroup> kda;
  std::vector<SeqPools> seqs;
  int64_t total_pools = 0, max_pools = 0, new_pools = 0;
  std::vector<int32_t> fresh_slots;  // state slots of sequences starting at position 0 (zeroed before the step)
  uint64_t hash = 0;                 // what the launches bake in beyond runtime/cuda's GraphKey
};

namespace {

// The glm5_next buffers of one step, carved after runtime/cuda's StepBuffers. KDA buffers hold this rank's heads
// (all of them on one rank); o_bf every head's output, gathered under tensor parallelism from o_local.
struct Glm5Buffers {
  float* x = nullptr;  // the streams [N, hc, hidden]
  float *pre = nullptr, *post = nullptr, *comb = nullptr;
  uint16_t *qkv = nullptr, *low = nullptr, *conv = nullptr, *o_bf = nullptr, *o_local = nullptr;
  float *g = nullptr, *beta = nullptr, *gate = nullptr, *o = nullptr;
  float *idx_gate = nullptr, *idx_rows = nullptr, *pool_keys = nullptr, *new_keys = nullptr;
  int32_t *select_ws = nullptr, *ints = nullptr;
};

void carve_glm5(const Glm5NextConfig& c, const Glm5NextCudaModel::Plan& P, int64_t N, const TensorShard& shard,
                kc::StepScratch& sc, Glm5Buffers& g) {
  const int64_t Hd = c.hidden_size, hc = c.hc_mult, H = shard.count(c.linear_num_heads), C = H * c.linear_head_dim;
  const int64_t dim = c.index_head_dim;
  g.x = sc.carve<float>(N * hc * Hd);
  g.pre = sc.carve<float>(N * hc), g.post = sc.carve<float>(N * hc), g.comb = sc.carve<float>(N * hc * hc);
  g.qkv = sc.carve<uint16_t>(N * 3 * C), g.conv = sc.carve<uint16_t>(N * 3 * C);
  g.low = sc.carve<uint16_t>(N * c.linear_head_dim), g.o_bf = sc.carve<uint16_t>(N * c.kda_channels());
  g.o_local = shard.sharded() ? sc.carve<uint16_t>(N * C) : g.o_bf;
  g.g = sc.carve<float>(N * C), g.beta = sc.carve<float>(N * H), g.gate = sc.carve<float>(N * C);
  g.o = sc.carve<float>(N * C);
  g.idx_gate = sc.carve<float>(N * dim), g.idx_rows = sc.carve<float>(N * 2 * dim);
  g.pool_keys = sc.carve<float>(std::max<int64_t>(P.total_pools, 1) * dim);
  g.new_keys = sc.carve<float>(std::max<int64_t>(P.new_pools, 1) * dim);
  g.select_ws = sc.carve<int32_t>(N * std::max<int64_t>(c.index_topk / c.index_kpool, 1));
  g.ints = sc.carve<int32_t>(std::max<size_t>(P.ints.size(), 1));
}

uint64_t mix(uint64_t h, int64_t v) { return (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; }

}  // namespace

Glm5NextCudaModel::Glm5NextCudaModel(Glm5NextConfig config, kc::CudaDeviceContext& dev)
    : config_(std::move(config)), impl_(std::make_unique<kc::CudaMlaMoeModel::Impl>(dev)), plan_(std::make_unique<Plan>()) {}
Glm5NextCudaModel::~Glm5NextCudaModel() = default;

Device Glm5NextCudaModel::device() const { return impl_->dev.device(); }
DeviceContext& Glm5NextCudaModel::device_context() { return impl_->dev; }
void Glm5NextCudaModel::set_step_profiling(bool on) { impl_->timer.enabled = on; }
std::vector<std::pair<std::string, double>> Glm5NextCudaModel::step_profile() const { return impl_->timer.totals(); }
int64_t Glm5NextCudaModel::profiled_steps() const { return impl_->timer.steps(); }
void Glm5NextCudaModel::clear_step_profile() { impl_->timer.clear(); }

Status Glm5NextCudaModel::supports(const Glm5NextConfig& c) {
  const std::string who = c.source + ": the CUDA runner for glm5_next ";
  if (c.linear_head_dim != kc::kKdaHeadDim || c.linear_conv_kernel_dim != kc::kKdaConvWidth)
    return unimplemented(who + "takes KDA heads of " + std::to_string(kc::kKdaHeadDim) + " and a short conv of " +
                         std::to_string(kc::kKdaConvWidth) + " (linear_head_dim " + std::to_string(c.linear_head_dim) +
                         ", linear_conv_kernel_dim " + std::to_string(c.linear_conv_kernel_dim) + ")");
  if (c.hc_mult != kc::kMhcStreams)
    return unimplemented(who + "takes hc_mult = " + std::to_string(kc::kMhcStreams) + " (got " +
                         std::to_string(c.hc_mult) + ")");
  if (c.hidden_size % 8 != 0 || c.moe_intermediate_size % 8 != 0 || c.kv_lora_rank % 8 != 0)
    return unimplemented(who + "needs hidden_size, moe_intermediate_size and kv_lora_rank to be multiples of 8");
  if (c.index_head_dim != kc::kPooledIndexerDim || c.index_n_heads > 64)
    return unimplemented(who + "takes index_head_dim = " + std::to_string(kc::kPooledIndexerDim) +
                         " and at most 64 indexer heads (got " + std::to_string(c.index_head_dim) + ", " +
                         std::to_string(c.index_n_heads) + ")");
  if (c.selection_width() > kc::kMaxTopK + c.index_kpool)
    return unimplemented(who + "selects at most " + std::to_string(kc::kMaxTopK) + " tokens (index_topk)");
  if (c.kda_state_bytes() != static_cast<size_t>(kc::kda_state_slot_bytes(c.linear_num_heads)))
    return internal_error(who + "disagrees with the KDA kernels on the state slot size");
  return ok_status();
}

Result<std::unique_ptr<Glm5NextCudaModel>> Glm5NextCudaModel::create_rank(const Glm5NextConfig& c,
                                                                         const BuildContext& ctx) {
  const int world = ctx.collective->world_size(), rank = ctx.collective->rank();
  KILN_RETURN_IF_ERROR(check_rank_process_group(ctx));
  KILN_RETURN_IF_ERROR(check_glm5_next_tensor_parallel_units(c, world));
  auto m = create(c, ctx, TensorShard{rank, world});
  if (!m.ok())
    return m.status().with_context("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world) +
                                   " on CUDA");
  return m;
}

Result<std::unique_ptr<Glm5NextCudaModel>> Glm5NextCudaModel::create(const Glm5NextConfig& c, const BuildContext& ctx,
                                                                    TensorShard shard) {
  KILN_RETURN_IF_ERROR(supports(c));
  auto* dev = dynamic_cast<kc::CudaDeviceContext*>(ctx.device);
  if (!dev) return failed_precondition("the CUDA model needs the core's CUDA device context");
  if (!ctx.layout->device().is_cuda())
    return failed_precondition("the KV layout was made for " + ctx.layout->device().to_string() + ", not CUDA");
  const int64_t block_size = ctx.layout->geometry().block_size;
  bool indexer = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) indexer |= c.runs_indexer(l);
  if (indexer && block_size % c.index_kpool != 0)
    return failed_precondition("kv.block_size = " + std::to_string(block_size) + " is not a multiple of index_kpool (" +
                               std::to_string(c.index_kpool) + " in " + c.source +
                               "): the CUDA pooled indexer reads each pool's keys from one block");
  std::unique_ptr<Glm5NextCudaModel> m(new Glm5NextCudaModel(c, *dev));
  // The DSA attention and the MoE as runtime/cuda's MLA + MoE blocks read them: no rope part, the selection as
  // wide as the pooled indexer's (top pools + the query's own tail pool).
  ModelConfig& a = m->mla_;
  a.model_type = "glm5_next", a.source = c.source;
  a.vocab_size = c.vocab_size, a.hidden_size = c.hidden_size, a.intermediate_size = c.intermediate_size;
  a.moe_intermediate_size = c.moe_intermediate_size, a.num_hidden_layers = c.num_hidden_layers;
  a.num_attention_heads = c.num_attention_heads, a.num_key_value_heads = c.num_attention_heads;
  a.q_lora_rank = c.q_lora_rank, a.kv_lora_rank = c.kv_lora_rank, a.qk_nope_head_dim = c.qk_nope_head_dim;
  a.qk_rope_head_dim = 0, a.v_head_dim = c.v_head_dim;
  a.n_routed_experts = c.n_routed_experts, a.n_shared_experts = c.n_shared_experts;
  a.num_experts_per_tok = c.num_experts_per_tok, a.n_group = c.n_group, a.topk_group = c.topk_group;
  a.routed_scaling_factor = c.routed_scaling_factor, a.norm_topk_prob = c.norm_topk_prob;
  a.moe_layers = c.moe, a.rms_norm_eps = c.rms_norm_eps, a.max_position_embeddings = c.max_position_embeddings;
  a.index_topk = c.selection_width(), a.index_head_dim = c.index_head_dim, a.index_n_heads = c.index_n_heads;
  a.indexer_shared_layers.assign(c.num_hidden_layers, false);
  kc::CudaMlaMoeModel::Impl& I = *m->impl_;
  I.layout = ctx.layout;
  I.collective = ctx.collective;
  I.shard = shard;
  I.sm_count = dev->multiprocessor_count();
  KILN_ASSIGN_OR_RETURN(void* done, dev->allocate(sizeof(unsigned), "MoE gate + route counter"));
  I.route_done = static_cast<unsigned*>(done);
  KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaMemsetAsync(I.route_done, 0, sizeof(unsigned), I.stream), "MoE gate + route counter"));
  if (ctx.load_mtp && !c.mtp_refusal.empty()) return failed_precondition(c.mtp_refusal);
  KILN_ASSIGN_OR_RETURN(m->weights_, load_glm5_next_gpu_weights(c, *ctx.source, *ctx.format, *dev, ctx.load_mtp, shard));
  return m;
}

Status Glm5NextCudaModel::run_step(int64_t mtp_index, std::span<const SequenceStep> steps, const float* prev_hidden,
                                   const CacheViews& caches, const StepOptions& options,
                                   std::vector<int64_t>& first_row) {
  const Glm5NextConfig& c = config_;
  kc::CudaMlaMoeModel::Impl& I = *impl_;
  const kc::StreamHandle st = I.s();
  const int64_t Hd = c.hidden_size, hc = c.hc_mult, bs = caches.block_size, pool = c.index_kpool;
  if (!caches.layout || bs <= 0) return invalid_argument("the CUDA model got no cache memory");
  for (int tap : options.tap_layers)
    if (tap != kTapFinalNormed && (tap < 0 || tap >= c.num_hidden_layers))
      return out_of_range("tap layer " + std::to_string(tap) + " does not exist (" + std::to_string(c.num_hidden_layers) +
                          " layers)");
  // The modality path: media rows (an image's embeddings) replace their placeholder tokens' embeddings.
  std::vector<std::pair<int64_t, const MediaRows*>> media;
  {
    int64_t row = 0;
    for (const SequenceStep& s : steps) {
      for (const MediaRows& m : s.media) media.emplace_back(row + m.first_row, &m);
      row += static_cast<int64_t>(s.tokens.size());
    }
  }
  if (!media.empty() && mtp_index >= 0) return invalid_argument("an MTP step takes no media rows");
  // The layers this step runs and their cache layers: the trunk's, or one next-n layer after them.
  const MtpGpu* mtp = mtp_index >= 0 ? &weights_.mtp[mtp_index] : nullptr;
  std::vector<std::pair<const LayerGpu*, int64_t>> layers;
  if (mtp) {
    layers.emplace_back(&mtp->layer, c.num_hidden_layers + mtp_index);
  } else {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) layers.emplace_back(&weights_.layers[l], l);
  }
  bool has_kda = false, has_indexer = false, dense = false;
  for (const auto& [w, l] : layers)
    has_kda |= w->kda != nullptr, has_indexer |= w->indexer != nullptr, dense |= w->dense_attention;
  if (has_indexer && bs % pool != 0)
    return failed_precondition("kv.block_size " + std::to_string(bs) + " is not a multiple of index_kpool " +
                               std::to_string(pool) + ": the CUDA pooled indexer reads a pool's keys from one block");

  kc::StepLayout& lay = I.layout_host;
  KILN_RETURN_IF_ERROR(kc::build_step_layout(steps, caches, mla_, lay, first_row));
  const int64_t S = static_cast<int64_t>(steps.size()), N = lay.tokens(), R = lay.logit_rows();

  // The step's plan: state slots, KDA launch groups, pools.
  Plan& P = *plan_;
  P.ints.clear(), P.kda.clear(), P.seqs.clear(), P.fresh_slots.clear();
  P.total_pools = P.max_pools = P.new_pools = 0;
  uint64_t h = 1469598103934665603ull;
  P.slot_off = 0;
  for (int64_t s = 0; s < S; ++s) {
    if (has_kda && steps[s].state_slot < 0)
      return failed_precondition("sequence step " + std::to_string(s) + " has no state slot (glm5_next's KDA layers need one)");
    P.ints.push_back(static_cast<int32_t>(std::max<int64_t>(steps[s].state_slot, 0)));
    if (has_kda && steps[s].start_position == 0) P.fresh_slots.push_back(static_cast<int32_t>(steps[s].state_slot));
  }
  for (int64_t s = 0, token = 0; s < S;) {
    const int64_t len = static_cast<int64_t>(steps[s].tokens.size());
    KdaGroup g;
    g.first_seq = s, g.first_token = token;
    int64_t e = s;
    if (len <= kKdaDecodeMaxTokens) {
      while (e < S && static_cast<int64_t>(steps[e].tokens.size()) == len) ++e;
      g.decode = true, g.seqs = e - s, g.tokens = len;
      token += g.seqs * len;
    } else {
      g.decode = false, g.cu_offset = static_cast<int64_t>(P.ints.size());
      P.ints.push_back(0);
      int64_t total = 0;
      while (e < S && static_cast<int64_t>(steps[e].tokens.size()) > kKdaDecodeMaxTokens) {
        total += static_cast<int64_t>(steps[e].tokens.size());
        P.ints.push_back(static_cast<int32_t>(total));
        ++e;
      }
      g.seqs = e - s, g.tokens = total;
      token += total;
    }
    h = mix(mix(mix(h, g.decode), g.seqs), g.tokens);
    P.kda.push_back(g);
    s = e;
  }
  if (has_indexer) {
    P.num_pools_off = static_cast<int64_t>(P.ints.size());
    for (int64_t s = 0, token = 0; s < S; ++s) {
      SeqPools q;
      q.first_token = token, q.len = static_cast<int64_t>(steps[s].tokens.size()), q.start = steps[s].start_position;
      q.num_pools = (q.start + q.len) / pool, q.pool_offset = P.total_pools;
      q.bound = (q.num_pools + kPoolBucket - 1) / kPoolBucket * kPoolBucket;
      P.total_pools += q.bound, P.max_pools = std::max(P.max_pools, q.bound);
      P.ints.push_back(static_cast<int32_t>(q.num_pools));
      P.seqs.push_back(q);
      h = mix(mix(h, q.len), q.bound);
      token += q.len;
    }
    P.pool_offset_off = static_cast<int64_t>(P.ints.size());
    for (const SeqPools& q : P.seqs) P.ints.push_back(static_cast<int32_t>(q.pool_offset));
    // Pools completed by this step's tokens: their keys are computed once, from the rows just written.
    std::vector<int32_t> first, dst;
    for (int64_t s = 0; s < S; ++s) {
      const SeqPools& q = P.seqs[s];
      for (int64_t p = q.start / pool; p < (q.start + q.len) / pool; ++p) {
        const int64_t slot = kv_slot(*steps[s].block_table, bs, p * pool);
        first.push_back(static_cast<int32_t>(slot));
        dst.push_back(static_cast<int32_t>(slot / pool));
      }
    }
    // Decode-shaped steps complete at most one pool a sequence: padded to S entries (dst −1 skipped), so a
    // captured graph's launch stays the same while pools complete.
    if (N == S) first.resize(S, 0), dst.resize(S, -1);
    P.new_pools = static_cast<int64_t>(first.size());
    P.new_first_off = static_cast<int64_t>(P.ints.size());
    P.ints.insert(P.ints.end(), first.begin(), first.end());
    P.new_dst_off = static_cast<int64_t>(P.ints.size());
    P.ints.insert(P.ints.end(), dst.begin(), dst.end());
    P.new_id_off = static_cast<int64_t>(P.ints.size());
    for (int64_t i = 0; i < P.new_pools; ++i) P.ints.push_back(static_cast<int32_t>(i));
    h = mix(h, P.new_pools);
  }
  P.hash = h;

  kc::StepShape sh;
  sh.N = N, sh.R = R, sh.S = S, sh.max_blocks = lay.max_blocks, sh.max_kv = lay.max_kv;
  // A DSA next-n layer without an indexer attends to every visible key (no selection).
  sh.attend_shape = {N, c.num_attention_heads, lay.max_kv, dense ? 0 : c.selection_width(),
                     N <= kc::kBatchInvariantMaxRows, I.sm_count};
  sh.attend = I.layout->plan_attend(sh.attend_shape);
  sh.scores_kv = std::max<int64_t>(P.max_pools, 1);
  for (const auto& [w, l] : layers)
    if (w->block.experts)
      sh.expert_workspace =
          std::max(sh.expert_workspace, w->block.experts->workspace_bytes(N, static_cast<int>(c.num_experts_per_tok)));
  // A drafter's tap of layer l: the mean of the layer's output streams in fp32 (the CPU model's tap); kTapFinalNormed:
  // the final-normed rows (b.hidden).
  const std::vector<int>& taps = mtp ? std::vector<int>{} : options.tap_layers;
  sh.taps = static_cast<int64_t>(std::count_if(taps.begin(), taps.end(), [](int t) { return t >= 0; }));
  sh.want_hidden = !mtp && (options.want_hidden || std::count(taps.begin(), taps.end(), kTapFinalNormed) > 0);
  sh.mtp = mtp != nullptr;
  sh.shard = I.shard;
  // The KDA heads' gather goes through the same staging as the MLA + MoE blocks' gathers.
  if (I.sharded())
    sh.extra_gather_staging = kc::gather_staging_bytes(I.shard, N, c.linear_num_heads, c.linear_head_dim, DType::kBF16);

  kc::StepBuffers& b = I.buffers;
  b = kc::StepBuffers{};
  Glm5Buffers G;
  I.scratch.begin(true);
  kc::carve_step_buffers(mla_, sh, I.scratch, b);
  carve_glm5(c, P, N, I.shard, I.scratch, G);
  KILN_RETURN_IF_ERROR(I.scratch.ensure(I.scratch.offset()));
  I.scratch.begin(false);
  kc::carve_step_buffers(mla_, sh, I.scratch, b);
  carve_glm5(c, P, N, I.shard, I.scratch, G);
  I.shape = sh;
  KILN_RETURN_IF_ERROR(kc::upload_step_layout(lay, b, I.uploads, I.stream));
  KILN_RETURN_IF_ERROR(kc::copy_device_tokens(steps, b.ids, I.stream));
  if (!P.ints.empty()) {
    KILN_ASSIGN_OR_RETURN(char* host, plan_upload_.acquire(P.ints.size() * 4));
    std::memcpy(host, P.ints.data(), P.ints.size() * 4);
    KILN_RETURN_IF_ERROR(plan_upload_.submit(G.ints, P.ints.size() * 4, I.stream, "glm5_next step plan"));
  }
  if (mtp)
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpyAsync(b.prev, prev_hidden, N * Hd * sizeof(float), cudaMemcpyDefault, I.stream), "MTP hidden rows"));
  // A rank's KDA state slots hold the largest share of the heads (its pool is its own: cache_spec's state_shares),
  // its heads from the start; one GPU's hold every head.
  const size_t kda_slot_bytes = c.kda_state_bytes(I.shard.max_count(c.linear_num_heads));
  // A new sequence's KDA state starts at zero.
  for (int32_t slot : P.fresh_slots)
    for (const auto& [w, l] : layers)
      if (w->kda) {
        auto* base = static_cast<char*>(caches.entry(l, 0));
        if (!base) return failed_precondition("layer " + std::to_string(l) + " has no KDA state slots");
        KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaMemsetAsync(base + static_cast<size_t>(slot) * kda_slot_bytes, 0,
                                                         kda_slot_bytes, I.stream),
                                         "KDA state reset"));
      }

  const float eps = static_cast<float>(c.rms_norm_eps);
  kc::StepTimer& timer = I.timer;
  auto mhc_params = [&](const MhcGpu& m) {
    kc::MhcDeviceParams p;
    p.fn = m.fn, p.base = m.base, p.scale = m.scale, p.dim = Hd, p.rms_eps = eps;
    p.hc_eps = static_cast<float>(c.hc_eps), p.sinkhorn_iters = c.hc_sinkhorn_iters;
    return p;
  };

  // KDA: b.h → b.y through the layer's state slots.
  auto kda_block = [&](const kc::StepContext& x, const KdaGpu& k, int64_t l) -> Status {
    const int64_t H = I.shard.count(c.linear_num_heads), C = H * c.linear_head_dim;  // this rank's heads
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.qkv, b.h, N, G.qkv, DType::kBF16));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.f_a, b.h, N, G.low, DType::kBF16));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.f_b, G.low, N, G.g, DType::kF32));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.b_proj, b.h, N, G.beta, DType::kF32));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.g_a, b.h, N, G.low, DType::kBF16));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.g_b, G.low, N, G.gate, DType::kF32));
    timer.mark("KDA: projections");
    kc::KdaGate forget;
    forget.a_log = k.a_log, forget.dt_bias = k.dt_bias, forget.has_lower_bound = c.linear_lower_bound.has_value();
    forget.lower_bound = static_cast<float>(c.linear_lower_bound.value_or(0.0));
    auto* state = static_cast<char*>(caches.entry(l, 0));
    if (!state) return failed_precondition("layer " + std::to_string(l) + " has no KDA state slots");
    for (const KdaGroup& grp : P.kda) {
      const int64_t t0 = grp.first_token;
      kc::KdaStateSlots slots;
      slots.state = state, slots.slot_bytes = static_cast<int64_t>(kda_slot_bytes);
      slots.slot_ids = G.ints + P.slot_off + grp.first_seq;
      if (grp.decode) {
        kc::KdaDecodeParams p;
        p.qkv = G.qkv + t0 * 3 * C, p.conv_weight = k.conv, p.g = G.g + t0 * C, p.beta_logits = G.beta + t0 * H;
        p.gate = G.gate + t0 * C, p.norm_weight = k.o_norm, p.norm_eps = eps, p.forget = forget, p.slots = slots;
        p.num_seqs = grp.seqs, p.tokens = grp.tokens, p.heads = H, p.out_bf16 = G.o_local + t0 * C;
        KILN_RETURN_IF_ERROR(kc::kda_decode(p, st).with_context("KDA decode"));
      } else {
        const int32_t* cu = G.ints + grp.cu_offset;
        KILN_RETURN_IF_ERROR(kc::kda_conv_prefill(G.qkv + t0 * 3 * C, k.conv, cu, grp.seqs, grp.tokens, H, slots,
                                                  G.conv + t0 * 3 * C, st)
                                 .with_context("KDA short conv"));
        kc::KdaPrefillParams p;
        p.qkv = G.conv + t0 * 3 * C, p.g = G.g + t0 * C, p.beta_logits = G.beta + t0 * H, p.forget = forget;
        p.slots = slots, p.cu_seqlens = cu, p.num_seqs = grp.seqs, p.total_tokens = grp.tokens, p.heads = H;
        p.out = G.o + t0 * C;
        KILN_RETURN_IF_ERROR(kc::kda_prefill(p, st).with_context("KDA chunked prefill"));
        KILN_RETURN_IF_ERROR(kc::kda_gated_rmsnorm(G.o + t0 * C, G.gate + t0 * C, k.o_norm, grp.tokens, H, eps, nullptr,
                                                   G.o_local + t0 * C, st));
      }
    }
    timer.mark("KDA: kernel");
    if (I.sharded())
      KILN_RETURN_IF_ERROR(kc::gather_units(x, G.o_local, N, c.linear_num_heads, c.linear_head_dim, DType::kBF16, G.o_bf));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *k.o_proj, G.o_bf, N, b.y, DType::kBF16));
    timer.mark("KDA: o_proj");
    return ok_status();
  };

  // The pooled indexer of layer l (called by the MLA block once b.q_res_n is ready): writes the step's [k | gate]
  // rows, the keys of pools this step completes, then scores every complete pool per query and selects.
  auto pooled_indexer = [&](const kc::StepContext& x, const PooledIndexerGpu& ix, int64_t l) -> Status {
    const int64_t dim = c.index_head_dim, heads = c.index_n_heads, width = c.selection_width();
    auto* rows = static_cast<float*>(caches.entry(l, 1));
    auto* keys = static_cast<float*>(caches.entry(l, 2));
    if (!rows || !keys) return failed_precondition("layer " + std::to_string(l) + " has no indexer caches");
    const float one = 1.0f, zero = 0.0f;
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *ix.wq_b, b.q_res_n, N, b.idx_q, DType::kF32));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *ix.wk, b.h, N, b.idx_k, DType::kF32));
    KILN_RETURN_IF_ERROR(kc::layernorm_f32(b.idx_k, ix.k_norm_weight, ix.k_norm_bias, N, dim, kIndexerNormEps, b.idx_k, st));
    KILN_RETURN_IF_ERROR(kc::bf16_to_f32(b.h, N * Hd, b.h32, st));
    KILN_RETURN_IF_ERROR(kc::blas_ok(cublasSgemm(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, dim, N, Hd, &one, ix.compress_gate, Hd,
                                                 b.h32, Hd, &zero, G.idx_gate, dim),
                                     "indexer compress gate"));
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *ix.weights_proj, b.h, N, b.idx_w, DType::kF32));
    const size_t row = dim * sizeof(float);
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpy2DAsync(G.idx_rows, 2 * row, b.idx_k, row, row, N, cudaMemcpyDeviceToDevice, I.stream), "indexer rows"));
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpy2DAsync(G.idx_rows + dim, 2 * row, G.idx_gate, row, row, N, cudaMemcpyDeviceToDevice, I.stream),
        "indexer rows"));
    KILN_RETURN_IF_ERROR(kc::scatter_rows_f32(G.idx_rows, N, 2 * dim, b.slots, rows, st));
    if (P.new_pools > 0) {
      KILN_RETURN_IF_ERROR(kc::pooled_indexer_pool_keys(rows, 2 * dim, rows + dim, 2 * dim, ix.ape, G.ints + P.new_first_off,
                                                        G.ints + P.new_id_off, P.new_pools, pool, G.new_keys, st));
      KILN_RETURN_IF_ERROR(scatter_rows_skip(G.new_keys, G.ints + P.new_dst_off, P.new_pools, dim, keys, st));
    }
    KILN_RETURN_IF_ERROR(gather_pool_keys(keys, b.tables, sh.max_blocks, bs, pool, G.ints + P.num_pools_off,
                                          G.ints + P.pool_offset_off, S, P.max_pools, G.pool_keys, st));
    // w_h · relu(s · q·k) · heads^-½ = w_h · relu(s · heads^-½ · q·k): the head-count scale rides in the score scale.
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim)) / std::sqrt(static_cast<float>(heads));
    const int64_t ws_row = std::max<int64_t>(c.index_topk / pool, 1);
    for (const SeqPools& q : P.seqs) {
      float* scores = b.idx_scores + q.first_token * sh.scores_kv;
      if (q.bound > 0)
        KILN_RETURN_IF_ERROR(kc::pooled_indexer_scores(b.idx_q + q.first_token * heads * dim, b.idx_w + q.first_token * heads,
                                                       G.pool_keys + q.pool_offset * dim, q.len, q.bound, heads, scale,
                                                       q.start, pool, scores, st, b.positions + q.first_token));
      KILN_RETURN_IF_ERROR(kc::pooled_indexer_select(scores, q.len, q.bound, q.start, pool, c.index_topk,
                                                     c.index_kpool_always_select_tail, G.select_ws + q.first_token * ws_row,
                                                     b.selected + q.first_token * width, width, st,
                                                     b.positions + q.first_token));
    }
    return ok_status();
  };

  // One decoder layer over the streams G.x (hyper-connections) or the fp32 residual b.resid (a plain next-n
  // layer: x += attn(input_norm x); x += mlp(post_attention_norm x), the last add left to the caller, b.y holding
  // the MLP's output).
  kc::StepBuffers dense_b = b;  // a DSA layer without an indexer attends with no selection
  dense_b.selected = nullptr;
  auto run_layer = [&](const LayerGpu& w, int64_t l) -> Status {
    const std::string where = "layer " + std::to_string(l);
    std::function<Status()> hook;
    kc::StepContext x{mla_, I, sh, w.dense_attention ? dense_b : b, bs, {}, nullptr};
    if (w.indexer) {
      hook = [&, l]() { return pooled_indexer(x, *w.indexer, l); };
      x.select = &hook;
    }
    auto attention = [&]() -> Status {
      if (w.kda) return kda_block(x, *w.kda, l).with_context(where + " KDA (GPU)");
      return kc::attention_block(x, w.block, caches.entry(l, 0), nullptr).with_context(where + " DSA (GPU)");
    };
    if (!w.hyper_connections) {
      KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaMemsetAsync(b.y, 0, N * Hd * sizeof(uint16_t), I.stream), "zero block"));
      KILN_RETURN_IF_ERROR(kc::add_rmsnorm_bf16(b.y, b.resid, w.block.input_norm, N, Hd, eps, b.h, st));
      KILN_RETURN_IF_ERROR(attention());
      KILN_RETURN_IF_ERROR(kc::add_rmsnorm_bf16(b.y, b.resid, w.block.post_attention_norm, N, Hd, eps, b.h, st));
      return kc::mlp_block(x, w.block, nullptr).with_context(where + " mlp (GPU)");
    }
    KILN_RETURN_IF_ERROR(kc::mhc_maps_collapse(G.x, N, mhc_params(w.attn_hc), G.pre, G.post, G.comb, nullptr, b.y, st));
    KILN_RETURN_IF_ERROR(kc::rmsnorm_bf16(b.y, w.block.input_norm, N, Hd, eps, b.h, st));
    timer.mark("mHC maps + collapse + RMSNorm");
    KILN_RETURN_IF_ERROR(attention());
    KILN_RETURN_IF_ERROR(kc::mhc_mix(G.x, b.y, G.post, G.comb, N, Hd, st));
    KILN_RETURN_IF_ERROR(kc::mhc_maps_collapse(G.x, N, mhc_params(w.ffn_hc), G.pre, G.post, G.comb, nullptr, b.y, st));
    KILN_RETURN_IF_ERROR(kc::rmsnorm_bf16(b.y, w.block.post_attention_norm, N, Hd, eps, b.h, st));
    timer.mark("mHC maps + collapse + RMSNorm");
    KILN_RETURN_IF_ERROR(kc::mlp_block(x, w.block, nullptr).with_context(where + " mlp (GPU)"));
    KILN_RETURN_IF_ERROR(kc::mhc_mix(G.x, b.y, G.post, G.comb, N, Hd, st));
    timer.mark("mHC mix");
    return ok_status();
  };

  // Embedding rows of the step's ids into `out`: under tensor parallelism each rank gathers its vocabulary rows
  // (zero rows for the others' ids) and the group sums them, each row's one owner giving its exact value.
  auto embed_rows = [&](uint16_t* out) -> Status {
    if (!I.sharded()) return kc::embedding_gather_bf16(weights_.embed_tokens, c.vocab_size, Hd, b.ids, N, out, st);
    return kc::rank_embedding_rows(I, mla_, weights_.embed_tokens, b.ids, N, b.ids_local, out);
  };
  auto enqueue_trunk = [&]() -> Status {
    KILN_RETURN_IF_ERROR(embed_rows(b.y));
    // Media rows over their placeholders' embeddings, rounded to bf16 as the table's rows are. From pageable memory:
    // the copy has taken the rows when it returns (steps with media are never graphed).
    for (const auto& [row, m] : media) {
      media_rows_.resize(static_cast<size_t>(m->count * Hd));
      for (int64_t i = 0; i < m->count * Hd; ++i) media_rows_[i] = cpu::float_to_bf16(m->embeddings[i]);
      KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaMemcpyAsync(b.y + row * Hd, media_rows_.data(), media_rows_.size() * 2,
                                                       cudaMemcpyHostToDevice, I.stream),
                                       "media rows"));
    }
    KILN_RETURN_IF_ERROR(hc_broadcast(b.y, N, hc, Hd, G.x, st));
    timer.mark("embedding");
    for (const auto& [w, l] : layers) {
      KILN_RETURN_IF_ERROR(run_layer(*w, l));
      for (int64_t t = 0, i = 0; t < static_cast<int64_t>(taps.size()); ++t) {
        if (taps[t] < 0) continue;
        if (taps[t] == l) KILN_RETURN_IF_ERROR(hc_mean_f32(G.x, N, hc, Hd, b.taps + i * N * Hd, st));
        ++i;
      }
    }
    KILN_RETURN_IF_ERROR(hc_mean_bf16(G.x, N, hc, Hd, b.y, st));
    KILN_RETURN_IF_ERROR(kc::rmsnorm_bf16(b.y, weights_.final_norm, N, Hd, eps, b.normed, st));
    if (sh.want_hidden) KILN_RETURN_IF_ERROR(kc::bf16_to_f32(b.normed, N * Hd, b.hidden, st));
    return ok_status();
  };
  // x = eh_proj(cat(enorm(embed(t)), hnorm(h))) into the fp32 residual (or copied into the streams), the layer,
  // its output (the next draft's hidden: b.resid) and shared_head.norm of it into b.normed.
  auto enqueue_mtp = [&]() -> Status {
    KILN_RETURN_IF_ERROR(embed_rows(b.y));
    KILN_RETURN_IF_ERROR(kc::rmsnorm_bf16(b.y, mtp->enorm, N, Hd, eps, b.normed, st));
    KILN_RETURN_IF_ERROR(kc::rmsnorm_rounded_f32_bf16(b.prev, Hd, mtp->hnorm, N, Hd, eps, b.h, st));
    const size_t row = Hd * sizeof(uint16_t);
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpy2DAsync(b.cat, 2 * row, b.normed, row, row, N, cudaMemcpyDeviceToDevice, I.stream), "MTP concat"));
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpy2DAsync(b.cat + Hd, 2 * row, b.h, row, row, N, cudaMemcpyDeviceToDevice, I.stream), "MTP concat"));
    const kc::StepContext x{mla_, I, sh, b, bs, {}, nullptr};
    KILN_RETURN_IF_ERROR(kc::run_linear(x, *mtp->eh_proj, b.cat, N, b.resid, DType::kF32));
    timer.mark("MTP input");
    const LayerGpu& w = mtp->layer;
    if (w.hyper_connections) {
      KILN_RETURN_IF_ERROR(hc_broadcast_f32(b.resid, N, hc, Hd, G.x, st));
      KILN_RETURN_IF_ERROR(run_layer(w, layers[0].second));
      KILN_RETURN_IF_ERROR(hc_mean_f32(G.x, N, hc, Hd, b.resid, st));
      KILN_RETURN_IF_ERROR(kc::rmsnorm_rounded_f32_bf16(b.resid, Hd, mtp->head_norm, N, Hd, eps, b.normed, st));
    } else {
      KILN_RETURN_IF_ERROR(run_layer(w, layers[0].second));
      KILN_RETURN_IF_ERROR(kc::add_rmsnorm_bf16(b.y, b.resid, mtp->head_norm, N, Hd, eps, b.normed, st));
    }
    return ok_status();
  };
  auto enqueue = [&]() -> Status {
    KILN_RETURN_IF_ERROR(mtp ? enqueue_mtp() : enqueue_trunk());
    // Logits only for the rows asked for (gathered with the embedding kernel, the normed states as the table).
    KILN_RETURN_IF_ERROR(kc::embedding_gather_bf16(b.normed, N, Hd, b.rows, R, b.row_states, st));
    const kc::StepContext x{mla_, I, sh, b, bs, {}, nullptr};
    const Linear& head = mtp && mtp->head ? *mtp->head : *weights_.lm_head;
    if (I.sharded()) {  // this rank's vocabulary rows, then every rank's gathered
      KILN_RETURN_IF_ERROR(kc::run_linear(x, head, b.row_states, R, b.logits_local, DType::kF32));
      KILN_RETURN_IF_ERROR(kc::gather_units(x, b.logits_local, R, c.vocab_size, 1, DType::kF32, b.logits));
    } else {
      KILN_RETURN_IF_ERROR(kc::run_linear(x, head, b.row_states, R, b.logits, DType::kF32));
    }
    timer.mark("final norm + lm_head");
    return ok_status();
  };

  // A collective that meets through the host (collective_capture.h) cannot be captured: such ranks run every step
  // directly.
  const bool capturable = !I.sharded() || collective_capturable(*I.collective);
  if (graphs_ && capturable && N == S && media.empty()) {
    kc::GraphKey key{mtp_index,
                     S,
                     R,
                     sh.max_blocks,
                     sh.scores_kv,
                     kc::tap_key(taps),
                     sh.attend,
                     sh.want_hidden,
                     I.scratch.base(),
                     caches.entry(0, 0),
                     static_cast<int64_t>(P.hash)};
    return I.graphs.run(key, I.stream, enqueue);
  }
  timer.begin(I.stream);
  const Status enqueued = enqueue();
  if (!enqueued.ok()) timer.finish();
  return enqueued;
}

Status Glm5NextCudaModel::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                               const CacheViews& caches, const StepOptions& options, StepOutput& out) {
  kc::CudaMlaMoeModel::Impl& I = *impl_;
  if (!select.empty() && select.size() != steps.size())
    return invalid_argument("token selection has " + std::to_string(select.size()) + " entries for " +
                            std::to_string(steps.size()) + " steps");
  KILN_RETURN_IF_ERROR(run_step(-1, steps, nullptr, caches, options, out.first_row));
  const kc::StepBuffers& b = I.buffers;
  const int64_t N = I.shape.N, R = I.shape.R, Hd = config_.hidden_size, V = config_.vocab_size;
  out.taps.clear();
  for (int64_t t = 0, i = 0; t < static_cast<int64_t>(options.tap_layers.size()); ++t) {
    float* data = options.tap_layers[t] == kTapFinalNormed ? b.hidden : b.taps + (i++) * N * Hd;
    out.taps.push_back(TensorView::contiguous(data, DType::kF32, {N, Hd}, I.dev.device()));
  }
  out.hidden.clear();
  if (options.want_hidden) {
    out.hidden.resize(N * Hd);
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpyAsync(out.hidden.data(), b.hidden, N * Hd * sizeof(float), cudaMemcpyDeviceToHost, I.stream), "hidden"));
  }
  out.logits.clear();
  if (options.want_logits) {
    out.logits.resize(R * V);
    KILN_RETURN_IF_ERROR(kc::cuda_ok(
        cudaMemcpyAsync(out.logits.data(), b.logits, R * V * sizeof(float), cudaMemcpyDeviceToHost, I.stream), "logits"));
  }
  if (select.empty()) {
    KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaStreamSynchronize(I.stream), "forward step"));
    out.tokens.assign(steps.size(), {});
    out.accepted.assign(steps.size(), 0);
  } else {
    KILN_RETURN_IF_ERROR(selection_.select(b.logits, V, out.first_row, select, I.stream, out));
  }
  I.timer.finish();
  return ok_status();
}

BatchInvariance Glm5NextCudaModel::batch_invariance() const {
  kiln::cuda::BatchInvariantBound b;
  b.add_absorption(mla_);
  for (const LayerGpu& l : weights_.layers) {
    b.add(l.block);
    if (l.kda)
      for (const auto* p :
           {&l.kda->qkv, &l.kda->f_a, &l.kda->f_b, &l.kda->b_proj, &l.kda->g_a, &l.kda->g_b, &l.kda->o_proj})
        b.add(p->get());
    if (l.indexer)
      for (const auto* p : {&l.indexer->wq_b, &l.indexer->wk, &l.indexer->weights_proj}) b.add(p->get());
  }
  BatchInvariance bound = b.bound(weights_.lm_head.get());
  // More than kKdaDecodeMaxTokens tokens of a sequence run KDA's chunked scan instead of the recurrent kernel.
  bound.chunk_rows = std::min(bound.chunk_rows, kKdaDecodeMaxTokens);
  return bound;
}

Status Glm5NextCudaModel::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                   const CacheViews& caches, MtpStepOutput& out) {
  if (layer < 0 || layer >= num_mtp_layers())
    return out_of_range("next-n layer " + std::to_string(layer) + " is not on the GPU (" +
                        std::to_string(num_mtp_layers()) + " loaded)");
  if (!hidden) return invalid_argument("MTP step without the hidden states it conditions on");
  kc::CudaMlaMoeModel::Impl& I = *impl_;
  KILN_RETURN_IF_ERROR(run_step(layer, steps, hidden, caches, StepOptions{}, out.first_row));
  // The layer's output rows go to a buffer of their own that outlives the step's scratch: the draft services tell a
  // draft row from an accepted one by whether its hidden state points into the previous step's output, so it must
  // never alias the target's taps (which live in the scratch).
  const int64_t rows = I.shape.N * config_.hidden_size;
  if (rows > mtp_hidden_rows_) {
    const int64_t want = std::max<int64_t>(rows, 2 * mtp_hidden_rows_);
    KILN_ASSIGN_OR_RETURN(void* p, I.dev.allocate(static_cast<size_t>(want) * sizeof(float), "next-n hidden rows"));
    mtp_hidden_ = static_cast<float*>(p);
    mtp_hidden_rows_ = want;
  }
  KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaMemcpyAsync(mtp_hidden_, I.buffers.resid, rows * sizeof(float),
                                                   cudaMemcpyDeviceToDevice, I.stream),
                                   "next-n hidden rows"));
  out.logits = I.buffers.logits;
  out.hidden = mtp_hidden_;
  if (I.timer.active()) {
    KILN_RETURN_IF_ERROR(kc::cuda_ok(cudaStreamSynchronize(I.stream), "MTP step"));
    I.timer.finish();
  }
  return ok_status();
}

Status Glm5NextCudaModel::embed(const int32_t* ids, int64_t n, TensorView out) {
  if (!out.device.is_cuda() || out.dtype != DType::kBF16 || out.numel() != n * config_.hidden_size)
    return invalid_argument("CUDA embedding rows go to device bf16 [n, hidden]");
  kc::CudaMlaMoeModel::Impl& I = *impl_;
  if (!I.sharded())
    return kc::embedding_gather_bf16(weights_.embed_tokens, config_.vocab_size, config_.hidden_size, ids, n,
                                     out.as<uint16_t>(), I.s());
  // As a step's embed_rows; every rank runs it (RankLeaderInstance forwards the call).
  KILN_ASSIGN_OR_RETURN(char* scratch, drafter_scratch_.get(I.dev, static_cast<size_t>(n) * sizeof(int32_t),
                                                            "tensor-parallel drafter scratch"));
  return kc::rank_embedding_rows(I, mla_, weights_.embed_tokens, ids, n, reinterpret_cast<int32_t*>(scratch),
                                 out.as<uint16_t>());
}

Status Glm5NextCudaModel::lm_head(const TensorView& hidden, float* logits) {
  if (!hidden.device.is_cuda() || hidden.dtype != DType::kBF16 || hidden.dim(-1) != config_.hidden_size)
    return invalid_argument("the CUDA lm_head takes device bf16 [n, hidden]");
  kc::CudaMlaMoeModel::Impl& I = *impl_;
  const int64_t n = hidden.numel() / config_.hidden_size;
  if (I.sharded()) {  // as a step's logits: this rank's vocabulary columns, every rank's gathered
    const size_t bytes = kc::rank_head_scratch_bytes(I.shard, n, config_.vocab_size);
    KILN_ASSIGN_OR_RETURN(char* scratch, drafter_scratch_.get(I.dev, bytes, "tensor-parallel drafter scratch"));
    return kc::rank_head_logits(I, mla_, *weights_.lm_head, hidden, scratch, logits);
  }
  LinearRun r;
  r.x = hidden;
  r.y = TensorView::contiguous(logits, DType::kF32, {n, config_.vocab_size}, impl_->dev.device());
  return weights_.lm_head->run(r, impl_->dev.stream());
}

Status Glm5NextCudaModel::sample_drafts(const DraftSampleRequest& r) {
  return selection_.sample_drafts(r, config_.vocab_size, impl_->stream);
}

}  // namespace kiln::glm5_next::cuda
