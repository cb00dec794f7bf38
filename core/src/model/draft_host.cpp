#include "model/draft_host.h"

#include <algorithm>
#include <set>
#include <string>

namespace kiln {
namespace {
std::string seq_name(int64_t seq_id) { return "drafter sequence " + std::to_string(seq_id); }
}  // namespace

Status PagedDraftHost::allocate(int64_t seq_id) {
  if (!sequences_.emplace(seq_id, Sequence{}).second) return already_exists(seq_name(seq_id) + " is already allocated");
  return ok_status();
}

Result<PagedDraftHost::Sequence*> PagedDraftHost::find(int64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return not_found(seq_name(seq_id) + " is not allocated");
  return &it->second;
}

Status PagedDraftHost::run(int64_t layer, const std::vector<DraftLayerRows>& batch, DraftLayerOutput& out) {
  if (layer < 0 || layer >= num_draft_layers())
    return out_of_range("draft layer " + std::to_string(layer) + " does not exist (the checkpoint has " +
                        std::to_string(num_draft_layers()) + ")");
  if (batch.empty()) return invalid_argument("draft layer run with an empty batch");
  const int64_t H = hidden_size();
  // Validate everything before touching any KV, so a bad entry leaves every sequence as it was.
  batch_seqs_.clear();
  std::set<int64_t> seen;
  int64_t rows = 0;
  for (const DraftLayerRows& r : batch) {
    KILN_ASSIGN_OR_RETURN(Sequence * s, find(r.seq_id));
    if (!seen.insert(r.seq_id).second) return invalid_argument(seq_name(r.seq_id) + " appears twice in one batch");
    if (r.num_rows <= 0 || !r.tokens || !r.hidden)
      return invalid_argument(seq_name(r.seq_id) + ": a batch entry needs rows, tokens and hidden states");
    if (r.start_position < 0 || r.start_position > s->length)
      return invalid_argument(seq_name(r.seq_id) + " holds " + std::to_string(s->length) +
                              " positions; rows cannot start at " + std::to_string(r.start_position));
    batch_seqs_.push_back(s);
    rows += r.num_rows;
  }
  hidden_.resize(rows * H);
  steps_.clear();
  int64_t offset = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftLayerRows& r = batch[b];
    KILN_RETURN_IF_ERROR(
        reserve_blocks(batch_seqs_[b]->table, r.start_position + r.num_rows).with_context(seq_name(r.seq_id)));
    std::copy_n(r.hidden, r.num_rows * H, hidden_.data() + offset * H);
    offset += r.num_rows;
    steps_.push_back({std::span<const int32_t>(r.tokens, r.num_rows), r.start_position, &batch_seqs_[b]->table, r.all_logits});
  }
  KILN_RETURN_IF_ERROR(run_layer(layer, steps_, hidden_.data(), step_out_));
  for (size_t b = 0; b < batch.size(); ++b) batch_seqs_[b]->length = batch[b].start_position + batch[b].num_rows;
  // Swapped rather than moved, so both sides keep their capacity for the next call.
  out.logits.swap(step_out_.logits);
  out.first_row.swap(step_out_.first_row);
  out.hidden.swap(step_out_.hidden);
  return ok_status();
}

Result<int64_t> PagedDraftHost::length(int64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return not_found(seq_name(seq_id) + " is not allocated");
  return it->second.length;
}

Status PagedDraftHost::truncate(int64_t seq_id, int64_t length) {
  if (length < 0) return invalid_argument(seq_name(seq_id) + ": cannot truncate to a negative length");
  KILN_ASSIGN_OR_RETURN(Sequence * s, find(seq_id));
  s->length = std::min(s->length, length);
  const size_t keep = static_cast<size_t>((s->length + block_size() - 1) / block_size());
  if (keep < s->table.size()) {
    std::vector<int32_t> tail(s->table.begin() + static_cast<std::ptrdiff_t>(keep), s->table.end());
    s->table.resize(keep);
    release_blocks(tail);
  }
  return ok_status();
}

void PagedDraftHost::release(int64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  release_blocks(it->second.table);
  sequences_.erase(it);
}

void PagedDraftHost::release_all() {
  for (auto& [id, s] : sequences_) release_blocks(s.table);
  sequences_.clear();
}

MtpDraftHost::MtpDraftHost(const MlaMoeModel& model, std::unique_ptr<KvCache> kv) : model_(model), kv_(std::move(kv)) {}

MtpDraftHost::~MtpDraftHost() { release_all(); }

int64_t MtpDraftHost::num_draft_layers() const { return static_cast<int64_t>(model_.weights().mtp.size()); }
int64_t MtpDraftHost::hidden_size() const { return model_.config().hidden_size; }
int64_t MtpDraftHost::vocab_size() const { return model_.config().vocab_size; }

Status MtpDraftHost::run_layer(int64_t layer, std::span<const SequenceStep> steps, const float* hidden, StepOutput& out) {
  return model_.mtp_forward(layer, steps, hidden, *kv_, out);
}

Result<std::shared_ptr<KvLayout>> create_draft_kv_layout(const Recipe& recipe, const Registry& registry,
                                                         const ModelInfo& info) {
  const RecipeSection& spec = recipe.section("speculative");
  const std::string dtype = spec.get_string("draft_kv_dtype", "bf16");
  const std::string layout = dtype == "fp8" ? "fp8_ds_mla" : dtype;
  CreateContext ctx;
  ctx.device = Device::cpu();
  ctx.model = &info;
  ctx.section = &recipe.section("kv");
  auto made = registry.create<KvLayout>(layout, ctx);
  if (!made.ok())
    return made.status().with_context("`speculative.draft_kv_dtype = \"" + dtype + "\"` (" +
                                      spec.origin("draft_kv_dtype") + ") needs KV layout `" + layout + "`");
  return std::move(made).value();
}

Result<std::unique_ptr<MtpDraftHost>> make_mtp_draft_host(const LoadedModel& m, const Recipe& recipe,
                                                          const Registry& registry, int64_t capacity_tokens) {
  const ModelConfig& c = m.model->config();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<KvLayout> layout, create_draft_kv_layout(recipe, registry, m.info));
  const KvGeometry g = layout->geometry();
  if (g.latent_dim != c.kv_lora_rank || g.rope_dim != c.qk_rope_head_dim)
    return failed_precondition("draft KV layout has geometry " + std::to_string(g.latent_dim) + "+" +
                               std::to_string(g.rope_dim) + ", the MTP layer needs " + std::to_string(c.kv_lora_rank) +
                               "+" + std::to_string(c.qk_rope_head_dim));
  const int64_t mtp_layers = static_cast<int64_t>(m.model->weights().mtp.size());
  const int64_t blocks = (capacity_tokens + g.block_size - 1) / g.block_size;
  auto kv = std::make_unique<KvCache>(std::move(layout), c.num_hidden_layers + mtp_layers, blocks,
                                      c.has_indexer() ? c.index_head_dim : 0, c.num_hidden_layers);
  return std::make_unique<MtpDraftHost>(*m.model, std::move(kv));
}

}  // namespace kiln
