#include "engine/engine_draft_services.h"

#include <algorithm>
#include <functional>
#include <string>

#include "model/checkpoint.h"

namespace kiln {

Status EngineDraftServices::mtp_run(int64_t layer, const std::vector<MtpRows>& batch, MtpOutput& out) {
  return run_mtp(layer, batch, nullptr, out);
}

Status EngineDraftServices::mtp_run_device_tokens(int64_t layer, std::vector<MtpRows> batch, const int32_t* device_tokens,
                                                  MtpOutput& out) {
  if (!device_tokens) return invalid_argument("next-n layer run on device tokens without the tokens");
  // On the CPU the device is the host: the tokens are read where they are.
  if (!device().device().is_cuda()) {
    int64_t at = 0;
    for (MtpRows& r : batch) r.tokens = device_tokens + at, at += r.num_rows;
    return run_mtp(layer, batch, nullptr, out);
  }
  return run_mtp(layer, batch, device_tokens, out);
}

Status EngineDraftServices::run_mtp(int64_t layer, const std::vector<MtpRows>& batch, const int32_t* device_tokens,
                                    MtpOutput& out) {
  if (layer < 0 || layer >= num_mtp_layers())
    return out_of_range("next-n layer " + std::to_string(layer) + " does not exist (" + std::to_string(num_mtp_layers()) +
                        " loaded)");
  if (!caches_) return failed_precondition("the draft services have no cache pool yet");
  if (batch.empty()) return invalid_argument("next-n layer run with an empty batch");
  const int64_t H = hidden_size();
  int64_t rows = 0;
  for (const MtpRows& r : batch) {
    if (r.num_rows <= 0 || (!r.tokens && !device_tokens) || !r.hidden || !r.block_table || r.start_position < 0)
      return invalid_argument("a next-n batch entry needs rows, tokens, hidden states, a block table and a position");
    if (r.num_blocks * caches_->views().block_size < r.start_position + r.num_rows)
      return invalid_argument("a next-n batch entry's block table covers " +
                              std::to_string(r.num_blocks * caches_->views().block_size) + " positions, needs " +
                              std::to_string(r.start_position + r.num_rows));
    rows += r.num_rows;
  }
  // The rows' hidden states may live anywhere on the device (the step's taps, the layer's last output): pack them.
  if (rows > packed_rows_) {
    const int64_t want = std::max<int64_t>(rows, 2 * packed_rows_);
    KILN_ASSIGN_OR_RETURN(void* p, device().allocate(static_cast<size_t>(want * H) * sizeof(float), "next-n rows"));
    packed_ = static_cast<float*>(p);
    packed_rows_ = want;
  }
  tables_.resize(batch.size());
  steps_.clear();
  int64_t offset = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const MtpRows& r = batch[b];
    const int64_t stride = r.hidden_stride > 0 ? r.hidden_stride : H;
    if (stride == H) {
      KILN_RETURN_IF_ERROR(device().copy(packed_ + offset * H, r.hidden, static_cast<size_t>(r.num_rows * H) * 4, false));
    } else {
      for (int64_t i = 0; i < r.num_rows; ++i)
        KILN_RETURN_IF_ERROR(device().copy(packed_ + (offset + i) * H, r.hidden + i * stride, static_cast<size_t>(H) * 4, false));
    }
    tables_[b].assign(r.block_table, r.block_table + r.num_blocks);
    offset += r.num_rows;
  }
  // State slots and committed rows of a next-n layer with state (see the header).
  const int64_t cache_layer = target_layers_ + layer;
  const bool stateful = caches_->has_state(cache_layer);
  std::vector<bool> committed(batch.size(), false);
  const float* own_begin = step_out_.hidden;
  const float* own_end = own_begin ? own_begin + step_out_rows_ * H : nullptr;
  int64_t token_offset = 0;
  if (device_tokens && placeholder_tokens_.size() < static_cast<size_t>(rows)) placeholder_tokens_.resize(rows, 0);
  for (size_t b = 0; b < batch.size(); ++b) {
    const MtpRows& r = batch[b];
    int32_t slot = -1;
    if (stateful) {
      slot = caches_->state_slot_of(r.block_table);
      if (slot < 0)
        return failed_precondition("next-n layer " + std::to_string(layer) +
                                   " keeps recurrent state, and batch entry " + std::to_string(b) +
                                   "'s block table is no running sequence's (pass DraftSequence::block_table)");
      const std::less<const float*> before;  // a total order across allocations
      committed[b] = !(own_begin && !before(r.hidden, own_begin) && before(r.hidden, own_end));
      if (committed[b]) KILN_RETURN_IF_ERROR(caches_->restore_layer_state(slot, cache_layer));
    }
    if (device_tokens) {
      // The step only counts these; the model copies the values from the device.
      steps_.push_back(SequenceStep{std::span<const int32_t>(placeholder_tokens_.data(), r.num_rows), r.start_position,
                                    &tables_[b], r.all_logits, slot, {}, device_tokens + token_offset});
    } else {
      steps_.push_back(SequenceStep{std::span<const int32_t>(r.tokens, r.num_rows), r.start_position, &tables_[b],
                                    r.all_logits, slot, {}});
    }
    token_offset += r.num_rows;
  }
  KILN_RETURN_IF_ERROR(model_.mtp_step(layer, steps_, packed_, caches_->views(), step_out_));
  step_out_rows_ = rows;
  for (size_t b = 0; b < batch.size(); ++b)
    if (committed[b]) KILN_RETURN_IF_ERROR(caches_->snapshot_layer_state(steps_[b].state_slot, cache_layer));
  out.logits = step_out_.logits;
  out.first_row = step_out_.first_row;
  out.hidden = step_out_.hidden;
  return ok_status();
}

void* EngineDraftServices::cache(int64_t layer, size_t entry) {
  if (!caches_ || layer < 0) return nullptr;
  return caches_->views().entry(first_drafter_layer_ + layer, entry);
}

Result<std::shared_ptr<const WeightSource>> EngineDraftServices::open_checkpoint(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> c, Checkpoint::open(dir));
  return std::shared_ptr<const WeightSource>(std::move(c));
}

}  // namespace kiln
