// The pieces one forward step of CudaMlaMoeModel is built from, shared by the files that implement it:
// the model's device state (Impl), the step's host layout and device buffers (StepLayout, StepBuffers), and the
// blocks a step enqueues (attention, MLP / MoE) over a StepContext. Internal to runtime/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kiln/collective.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/mla_moe_model.h"
#include "runtime/cuda/cuda_device_context.h"
#include "runtime/cuda/cuda_mla_moe_model.h"
#include "runtime/cuda/mla_prefill_attention.h"
#include "runtime/cuda/step_timer.h"

namespace kiln::cuda {

// As the CPU model: HF builds q_a_layernorm and kv_a_layernorm with the class default eps.
inline constexpr float kLatentNormEps = 1e-6f;

Status cuda_ok(cudaError_t e, const char* what);
Status blas_ok(cublasStatus_t s, const char* what);

// The smallest power of two ≥ v, and ≥ at_least.
int64_t round_up_pow2(int64_t v, int64_t at_least);

// One step's token layout on the host: the flattened tokens, their positions and slots, one query row per
// token, the padded block tables, the rows that get logits.
struct StepLayout {
  std::vector<int32_t> ids, query_seq, kv_len, tables, rows;
  std::vector<int64_t> positions, slots;
  int64_t max_blocks = 1, max_kv = 1;
  // Sequences whose rows attend through the expanded-form prefill kernel (see kPrefillMinTokens); their rows
  // get kv_len 1 in `kv_len`, so the absorbed decode kernel's pass over them is one key, overwritten after.
  std::vector<MlaPrefillSequence> prefill;
  int64_t prefill_keys = 0;  // Σ kv_len over `prefill`
  // Decode-context parallelism: the longest kv_len of a row over this rank's own tokens (kv_len holds those), and
  // the rows a rank sends for the prefilling sequences' context (Σ over them of rank 0's count, the largest).
  int64_t max_local_kv = 1;
  int64_t context_rows = 0;
  int64_t tokens() const { return static_cast<int64_t>(ids.size()); }
  int64_t logit_rows() const { return static_cast<int64_t>(rows.size()); }
};

// A sequence bringing at least this many tokens in a step (a prompt chunk) attends through the expanded-form
// prefill kernel; fewer (decode, speculative verification of 1 + K ≤ 6 rows) through the absorbed decode
// kernel, so a sequence's decode-time rows always take the same arithmetic path, whatever else the step holds.
inline constexpr int64_t kPrefillMinTokens = kExpandedPrefillMinTokens;  // the CPU model's bf16 precision follows it

// Batch invariance: in a step of at most this many rows, each decode-shaped row's results (its KV cache entry,
// hidden state and logits) are bitwise the same whatever other rows share the step, so speculative verification
// (1 + K rows a sequence) reproduces plain decoding exactly. Every reduction a row goes through then has an
// order fixed by the model and the GPU alone: the skinny GEMM for the projections and the per-head absorption
// products, the gate GEMV for the MoE router, per-expert GEMVs for the routed experts, split-KV partitions that
// follow each row's own length in the tensor-core attention, and per-row kernels for the rest. Beyond it the
// GEMMs run on cuBLAS (and the routed experts on the grouped GEMM), whose order follows the row count. The lm_head
// of a wide vocabulary stays on the skinny GEMM up to the same bound (kSkinnyGemmMaxRowsWideOut), though cuBLAS
// would be faster there from 16 rows, so the logits are invariant up to 32 logit rows a step too.
// Prompt chunks of kPrefillMinTokens or more are not covered (their attention runs the prefill kernel).
inline constexpr int64_t kBatchInvariantMaxRows = kSkinnyGemmMaxRows;

// The per-head absorption products of a batch-invariant step run the skinny GEMM as a strided batch over heads
// (cuBLAS's batched GEMM picks its algorithm by the row count); it needs 16-byte aligned rows. Where the model's
// head widths do not allow it, only one-row steps are batch-invariant (BatchInvariantBound::add_absorption).
inline bool absorbs_with_skinny_gemm(const ModelConfig& c, int64_t rows) {
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  return rows <= kBatchInvariantMaxRows && qk % 8 == 0 && c.qk_nope_head_dim % 8 == 0 && c.kv_lora_rank % 8 == 0;
}


// Fills `layout` (and first_row: per step its first logits row) from the steps, checking each against the pool's
// block count. With the context split (decode-context parallelism, see CudaMlaMoeModel::Impl::context) the slots
// and kv_len are this rank's: its own positions' slots (−1 for the others') and counts of its own visible tokens.
Status build_step_layout(std::span<const SequenceStep> steps, const CacheViews& caches, const ModelConfig& c,
                         StepLayout& layout, std::vector<int64_t>& first_row, const DecodeContextShard& context = {});

// Launch shapes of one step, fixed before any buffer is carved.
struct StepShape {
  int64_t N = 0, R = 0, S = 0, max_blocks = 1, max_kv = 1;
  MlaAttendShape attend_shape;  // what the KV layout planned the absorbed attention for
  MlaAttendPlan attend;         // its split-KV factor and workspace
  int64_t scores_kv = 0;        // the DSA indexer's score row width (0 without an indexer)
  bool mtp = false;             // an MTP layer's step (its input is built from the previous hidden states)
  size_t prefill_workspace = 0;  // bytes for mla_prefill_attention (0: no sequence prefills this step)
  size_t expert_workspace = 0;   // the routed experts' (ExpertSet::workspace_bytes)
  int64_t taps = 0;              // tapped layers (fp32 [N, hidden] each)
  bool want_hidden = false;      // the final-normed hidden states in fp32 (a tap of kTapFinalNormed, or tests)
  TensorShard shard;             // this rank's part of a tensor-parallel group's work (one rank: all of it)
  size_t extra_gather_staging = 0;  // an architecture's own gathers' staging bytes (glm5_next's KDA heads)
  DecodeContextShard context;       // decode-context parallelism (Impl::context); world 1: none
  int64_t context_rows = 0;         // StepLayout::context_rows
  // Rows of the whole step where a lone prompt runs layer by layer in tiles of N rows (layer-major prefill,
  // cuda_mla_moe_model.cpp): its token arrays, residual stream, block inputs, final-normed rows, hidden states and
  // taps hold all of them, every other buffer one tile. 0: the step is one tile (N rows).
  int64_t full_rows = 0;
};

// One step's device buffers (see CudaMlaMoeModel::forward for what each holds).
struct StepBuffers {
  int32_t *ids, *query_seq, *kv_len, *tables, *rows;
  int64_t *positions, *slots;
  float* resid;
  uint16_t *h, *y, *q_res_n, *q_bf, *o_lat_bf, *attn;
  float *qkv_a;  // [N, q_lora_rank + D] fp32: q_a's output then the latent + k_pe (q_lora_rank 0: the latter only)
  float *q, *q_abs;
  void* mla_workspace;  // the KV layout's attend workspace
  uint16_t *gu, *act, *shared;
  float *h32, *router_logits, *route_w, *moe_y;
  int32_t *route_ids, *offsets, *active, *order;
  void* expert_workspace;
  uint16_t *normed, *row_states;
  float *logits, *hidden;
  float* taps;  // [taps, N, hidden] fp32
  // DSA: indexer queries [N, heads·dim], keys [N, dim], head weights [N, heads], scores [N, scores_kv], and the
  // selected key positions [N, index_topk] (kept across layers: shared-indexer layers reuse them).
  float *idx_q, *idx_k, *idx_w, *idx_scores;
  int32_t* selected;
  void* prefill_workspace;  // mla_prefill_attention's scratch (null without prefilling sequences)
  float* prev;    // MTP: the hidden states the rows condition on [N, hidden]
  uint16_t* cat;  // MTP: cat(enorm(embedding), hnorm(prev)) [N, 2·hidden]
  // Tensor parallelism only (null on one rank): this rank's part before a gather — its heads' attention output
  // [N, heads·v], its dense-MLP SwiGLU columns [N, columns], its vocabulary rows' logits [R, rows] — the token ids
  // and routed pairs' expert ids moved into this rank's numbering, and the all_gather's staging (send, receive).
  uint16_t *attn_local, *act_local;
  float* logits_local;
  int32_t *ids_local, *pair_ids_local;
  char *gather_send, *gather_recv;
  // Decode-context parallelism only (cuda_split_context.cpp): every head's absorbed queries [N, heads, latent +
  // rope], this rank's partial attention [N, heads, latent] and log-sum-exp [N, heads], every rank's of both, and the
  // prefilling sequences' context rows (this rank's bf16 rows, every rank's, their gather table).
  float *q_group, *ctx_part, *ctx_lse, *ctx_parts, *ctx_lses;
  uint16_t *ctx_rows_send, *ctx_rows_recv;
  KvGatherSeq* ctx_gather_seqs;
};

// Lays the step's buffers out in `scratch` (see StepScratch: a measuring pass, then the real one).
void carve_step_buffers(const ModelConfig& c, const StepShape& shape, StepScratch& scratch, StepBuffers& b);

// Copies the layout's index arrays into the step's buffers on `stream` in one DMA: they are carved back to back
// (ids .. slots), so they are packed at the same offsets into a slot of `staging` first. Steps may follow each
// other without a host synchronisation (the ring keeps each slot until its DMA has run).
Status upload_step_layout(const StepLayout& layout, const StepBuffers& b, PinnedUploadRing& staging,
                          cudaStream_t stream);
// Steps whose tokens are on the device (SequenceStep::device_tokens): copied over their rows of the uploaded ids,
// so a drafter's next step can take the token it just sampled without a round trip through the host.
Status copy_device_tokens(std::span<const SequenceStep> steps, int32_t* ids, cudaStream_t stream);

// What a captured step bakes in: buffer addresses (the scratch base and its layout, the KV pages) and launch
// shapes.
struct GraphKey {
  int64_t variant;  // −1 the trunk, i MTP layer i
  int64_t steps, rows, max_blocks, scores_kv, taps;
  MlaAttendPlan attend;  // the KV layout's launch for this shape
  bool want_hidden;
  const void* scratch;
  const void* pages;
  int64_t extra = 0;  // what else an architecture's step bakes in (glm5_next: a hash of its per-sequence launches)
  int64_t tokens = 0;  // the step's rows (a verification step has several per sequence)
  bool operator==(const GraphKey&) const = default;
};

// GraphKey::taps: identifies the tapped layers (a captured step copies exactly those).
inline int64_t tap_key(const std::vector<int>& taps) {
  uint64_t h = taps.size();
  for (int t : taps) h = h * 1000003u + static_cast<uint64_t>(t + 2);
  return static_cast<int64_t>(h);
}

// Captured steps, replayed by shape; at most kMaxGraphs (the oldest goes first), all dropped when the scratch moves.
class StepGraphs {
 public:
  static constexpr size_t kMaxGraphs = 64;
  ~StepGraphs() { clear(); }
  // Replays the graph of `key`, capturing `enqueue` into it first when there is none.
  template <typename Enqueue>
  Status run(const GraphKey& key, cudaStream_t stream, Enqueue&& enqueue) {
    cudaGraphExec_t exec = find(key);
    if (!exec) {
      prepare_for(key);
      KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
      const Status captured = enqueue();
      KILN_ASSIGN_OR_RETURN(exec, finish_capture(key, stream, captured));
    }
    return cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
  }
  void clear();

 private:
  cudaGraphExec_t find(const GraphKey& key) const;
  void prepare_for(const GraphKey& key);
  Result<cudaGraphExec_t> finish_capture(const GraphKey& key, cudaStream_t stream, const Status& captured);
  std::vector<std::pair<GraphKey, cudaGraphExec_t>> graphs_;
};

struct CudaMlaMoeModel::Impl {
  explicit Impl(CudaDeviceContext& d) : dev(d), stream(d.cuda_stream()), blas(d.blas()), gemm(&d.gemm()) {}
  CudaDeviceContext& dev;
  cudaStream_t stream;
  cublasHandle_t blas;
  CublasGemm* gemm;
  const KvLayout* layout = nullptr;
  Collective* collective = nullptr;  // the tensor-parallel group (none: one rank)
  TensorShard shard;                 // this rank's part of the group's work (load_gpu_weights' split)
  // Decode-context parallelism (parallel.decode_context = D, model/decode_context_shard.h): the KV cache split by
  // token over the group's D ranks — position p on rank p mod D as its local token p div D. On CUDA the group is the
  // whole tensor-parallel group (D = parallel.tensor) and each rank has a pool of its own, so a rank keeps its
  // local tokens of engine block b in its page b (pages of kv.block_size = the scheduler's block / D tokens).
  DecodeContextShard context;
  bool sharded() const { return collective && shard.sharded(); }
  StepScratch scratch;
  float* inv_freq = nullptr;
  float rope_factor = 1.0f;
  unsigned* route_done = nullptr;  // moe_gate_route_and_group's counter (the model's kernels share one stream)
  int sm_count = 0;
  StepLayout layout_host;
  StepBuffers buffers;  // the last step's (its logits, taps and hidden states live there until the next step)
  StepShape shape;
  StepGraphs graphs;
  StepTimer timer;
  PinnedUploadRing uploads;  // the step layout's host staging (upload_step_layout)

  ~Impl() { graphs.clear(); }
  StreamHandle s() const { return stream; }
  Stream sdk_stream() const { return dev.stream(); }
};

// Everything a block of one step needs: the model's state, the step's shape and buffers.
struct StepContext {
  const ModelConfig& c;
  CudaMlaMoeModel::Impl& I;
  const StepShape& shape;
  const StepBuffers& b;
  int64_t block_size;
  std::span<const MlaPrefillSequence> prefill;  // sequences attending through the prefill kernel
  // A DSA layer without a lightning indexer of its own calls this (when set) after its KV append, to fill
  // b.selected: an architecture's own selection (glm5_next's pooled indexer), which may read b.q_res_n.
  const std::function<Status()>* select = nullptr;
  // Layer-major prefill (one prompt in tiles): the prefill workspace's key capacity, and the keys this layer's
  // earlier tiles left gathered and expanded in it (mla_prefill_attention's key_capacity / keys_ready).
  int64_t prefill_key_capacity = 0;
  int64_t prefill_keys_ready = 0;
};

// y = x · Wᵀ through a Linear of the recipe's weight format (bf16 x; y bf16 or fp32).
Status run_linear(const StepContext& x, const Linear& l, const void* in, int64_t n, void* out, DType out_dtype);

// Whether environment variable `name` is set to `value` (the blocks' A/B switches read it once, into a static).
bool env_is(const char* name, std::string_view value);

// Tensor parallelism (x.I.sharded()): full [n, units · width] (row stride units · width) from every rank's local
// [n, (its units) · width] in unit order — each rank's block padded to the largest part so that one all_gather
// moves them, then copied into place. Copies only, so the values are exactly the owners'.
Status gather_units(const StepContext& x, const void* local, int64_t n, int64_t units, int64_t width, DType dtype,
                    void* full);
// The send staging gather_units needs for n rows of `units` · width elements of `dtype`, in bytes (the receive
// staging is world times that).
size_t gather_staging_bytes(const TensorShard& shard, int64_t n, int64_t units, int64_t width, DType dtype);
// Sums `count` elements over the tensor-parallel group in place, on the step's stream. Only where at most one rank
// holds a non-zero value per element (masked embedding rows, routed pairs of one owner): the sum is then exact.
Status sum_exclusive(const StepContext& x, void* y, int64_t count, DType dtype);
// Embedding rows on a tensor-parallel rank (a step's, a drafter's): this rank's vocabulary rows of `table` (zero
// rows for the others' ids), then the group's exclusive sum. `local_ids`: n int32 of device scratch.
Status rank_embedding_rows(CudaMlaMoeModel::Impl& I, const ModelConfig& c, const uint16_t* table, const int32_t* ids,
                           int64_t n, int32_t* local_ids, uint16_t* out);
// A drafter's logits on a tensor-parallel rank, as a step's: this rank's vocabulary columns of `head` over the bf16
// rows `hidden`, then every rank's gathered in vocabulary order into logits [n, vocab]. `scratch`:
// rank_head_scratch_bytes of device memory apart from the step's buffers (a drafter may still read those).
size_t rank_head_scratch_bytes(const TensorShard& shard, int64_t n, int64_t vocab);
Status rank_head_logits(CudaMlaMoeModel::Impl& I, const ModelConfig& c, const Linear& head, const TensorView& hidden,
                        char* scratch, float* logits);

// Decode-context parallelism (cuda_split_context.cpp), meetings of the whole tensor-parallel group:
// the absorbed attention of the step's rows into b.o_lat_bf — every head's queries gathered, each rank attending
// them over its own tokens (out_lse), the partial results gathered and merged by log-sum-exp in rank order, each rank
// keeping its heads — and the prefilling sequences' context rows, every rank's own rows gathered into position order.
Status split_context_attend(const StepContext& x, const void* pages, float scale);
Status split_context_rows(const StepContext& x, const void* pages, uint16_t* latent);

// The MLA block: b.h (the normed input) → b.y, appending to the layer's pages `pages` through the KV layout (and
// for a DSA layer with its own indexer, its keys `index_keys`, refreshing b.selected).
Status attention_block(const StepContext& x, const GpuLayer& w, void* pages, void* index_keys);

// The DSA lightning indexer of layer `w`: writes this step's keys into `index_keys` (rows in the KV layout's
// indexer_key_format) and selects, per query
// row, the index_topk key positions attention may see (b.selected, −1 padded as cpu::dsa_select_topk).
Status indexer_block(const StepContext& x, const GpuIndexer& w, void* index_keys);

// The next block's pre-norm residual step, for the MLP block to finish with: b.resid += the block's output,
// out = rmsnorm(b.resid) · weight (what add_rmsnorm_bf16(b.y, b.resid, weight, N, hidden, eps, out) does).
struct NextNorm {
  const uint16_t* weight = nullptr;
  float eps = 0.f;
  uint16_t* out = nullptr;
};

// The MLP block: b.h → b.y (dense SwiGLU MLP, or routed experts plus shared experts). With `next` the block
// also takes the next block's residual add + RMSNorm (the caller skips its own add_rmsnorm_bf16): a MoE layer
// fuses it with the combine of the experts' outputs (one launch, b.y not written), a dense layer runs
// add_rmsnorm_bf16 after it. Bit for bit the same either way.
Status mlp_block(const StepContext& x, const GpuLayer& w, const NextNorm* next = nullptr);

}  // namespace kiln::cuda
