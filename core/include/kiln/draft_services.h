// Services the engine lends a drafter, on the target's device (passed in CreateContext::draft_services; they
// outlive every drafter created with them; one call at a time). Pointers named "device" are on that device
// (host memory on the CPU); the services never copy a full-vocabulary row to the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device_context.h"
#include "kiln/tensor.h"
#include "kiln/weight_format.h"

namespace kiln {

// Rows of one sequence for the target's next-n (MTP) layer. Row i at position p = start_position + i drafts
// t_{p+2} from tokens[i] = t_{p+1} and hidden row i (the target's final-normed hidden state h_p, or the layer's own
// output for recursive steps). The layer's KV rows from start_position on are (over)written, in the pages of the
// sequence's block table (the target's: next-n layers are paged with the target's layers).
struct MtpRows {
  const int32_t* block_table = nullptr;  // host, DraftSequence::block_table
  int64_t num_blocks = 0;
  int64_t start_position = 0;
  const int32_t* tokens = nullptr;  // host [num_rows]
  const float* hidden = nullptr;    // device [num_rows, hidden_size] fp32, rows hidden_stride floats apart
  int64_t hidden_stride = 0;        // 0: hidden_size
  int64_t num_rows = 0;
  bool all_logits = false;          // logits for every row, or only the last
};

struct MtpOutput {
  const float* logits = nullptr;     // device [rows with logits, vocab]
  std::vector<int64_t> first_row;    // per batch entry: its first row in `logits`
  const float* hidden = nullptr;     // device [Σ num_rows, hidden_size]: the layer's output before its head norm
};

// Draft tokens from rows of logits, on the device: argmax where temperature ≤ 0, else a draw (with the given
// uniform) from q = softmax(logits / T) over its q_width largest logits, renormalised; q is written sparse.
struct DraftSampleRequest {
  const float* logits = nullptr;      // device [rows, vocab]
  int64_t rows = 0;
  const float* temperatures = nullptr;  // host [rows]
  const double* uniforms = nullptr;     // host [rows], in [0, 1)
  int64_t q_width = 0;                  // 1 .. 256
  int32_t* tokens = nullptr;            // device [rows]
  int32_t* q_ids = nullptr;             // device: row r at q_ids + r · q_row_stride, q_width entries (−1 when greedy)
  float* q_probs = nullptr;
  int64_t q_row_stride = 0;             // 0: q_width
};

class DraftServices {
 public:
  virtual ~DraftServices() = default;
  virtual DeviceContext& device() = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_target_layers() const = 0;

  // The target's embedding rows for device ids [n]: out [n, hidden_size] bf16 or fp32 on the device.
  virtual Status embed(const int32_t* ids, int64_t n, TensorView out) = 0;
  // The target's lm_head over already-normed rows: hidden [n, hidden_size] (bf16 on CUDA, fp32 on the CPU) →
  // logits fp32 [n, vocab_size] on the device.
  virtual Status lm_head(const TensorView& hidden, float* logits) = 0;
  virtual Status sample(const DraftSampleRequest& request) = 0;

  // The target checkpoint's next-n layers (loaded when a drafter's capabilities ask for them). One batch entry per
  // sequence. `out` stays valid until the next mtp_run.
  virtual int64_t num_mtp_layers() const = 0;
  virtual Status mtp_run(int64_t layer, const std::vector<MtpRows>& batch, MtpOutput& out) = 0;

  // (ABI 2.2) mtp_run with the rows' tokens on the device: device_tokens [Σ num_rows] in batch order (each entry's
  // `tokens` is then ignored). A drafter chains its recursive steps through it — step k's sampled drafts are step
  // k + 1's tokens — with no host synchronisation between them. The engine's services keep them on the device; this
  // fallback copies them to the host first.
  virtual Status mtp_run_device_tokens(int64_t layer, std::vector<MtpRows> batch, const int32_t* device_tokens,
                                       MtpOutput& out) {
    int64_t rows = 0;
    for (const MtpRows& r : batch) rows += r.num_rows;
    std::vector<int32_t> host(static_cast<size_t>(rows));
    KILN_RETURN_IF_ERROR(device().copy(host.data(), device_tokens, host.size() * sizeof(int32_t), true));
    int64_t at = 0;
    for (MtpRows& r : batch) r.tokens = host.data() + at, at += r.num_rows;
    return mtp_run(layer, batch, out);
  }

  // The drafter's own paged caches (its capabilities' cache_layers, in order): entry `entry` of layer `layer`,
  // [num_blocks · block_size, that entry's bytes per token], addressed by the sequences' block tables.
  virtual void* cache(int64_t layer, size_t entry) = 0;
  virtual int64_t block_size() const = 0;

  // A drafter's own checkpoint: `speculative.draft_model` (empty when the recipe names none), its tensors, and the
  // recipe's weight format on this device to load them with.
  virtual std::string draft_model_path() const = 0;
  virtual Result<std::shared_ptr<const WeightSource>> open_checkpoint(const std::string& dir) = 0;
  virtual WeightFormat& weight_format() = 0;
};

}  // namespace kiln
