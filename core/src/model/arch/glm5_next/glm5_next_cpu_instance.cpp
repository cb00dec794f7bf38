#include "model/arch/glm5_next/glm5_next_cpu_instance.h"

#include <string>

#include "model/host_model_args.h"
#include "model/host_token_select.h"

namespace kiln::glm5_next {

Result<std::unique_ptr<Glm5NextCpuInstance>> Glm5NextCpuInstance::create(const Glm5NextConfig& config,
                                                                         const BuildContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Glm5NextWeights weights,
                        load_glm5_next_weights(config, *ctx.source, *ctx.format, ctx.load_mtp, ctx.precision));
  auto model = std::make_unique<Glm5NextModel>(config, std::move(weights));
  model->set_precision(ctx.precision);
  model->set_threads(ctx.threads);
  return std::unique_ptr<Glm5NextCpuInstance>(new Glm5NextCpuInstance(std::move(model), *ctx.device));
}

Status Glm5NextCpuInstance::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                                 const CacheViews& caches, const StepOptions& options, StepOutput& out) {
  KILN_RETURN_IF_ERROR(model_->forward(steps, caches, options, out));
  if (select.empty()) {
    out.tokens.assign(steps.size(), {});
    out.accepted.assign(steps.size(), 0);
    return ok_status();
  }
  if (select.size() != steps.size())
    return invalid_argument("token selection has " + std::to_string(select.size()) + " entries for " +
                            std::to_string(steps.size()) + " steps");
  return select_tokens_host(out.logits.data(), vocab_size(), out.first_row, select, out);
}

Status Glm5NextCpuInstance::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                     const CacheViews& caches, MtpStepOutput& out) {
  KILN_RETURN_IF_ERROR(model_->mtp_forward(layer, steps, hidden, caches, mtp_out_));
  out.logits = mtp_out_.logits.data();
  out.first_row = mtp_out_.first_row;
  out.hidden = mtp_out_.hidden.data();
  return ok_status();
}

Status Glm5NextCpuInstance::embed(const int32_t* ids, int64_t n, TensorView out) {
  KILN_RETURN_IF_ERROR(check_host_embed_args(ids, n, out, vocab_size(), hidden_size()));
  model_->embed(ids, n, out.as<float>());
  return ok_status();
}

Status Glm5NextCpuInstance::lm_head(const TensorView& hidden, float* logits) {
  KILN_RETURN_IF_ERROR(check_host_lm_head_args(hidden, hidden_size()));
  return model_->lm_head(hidden.as<float>(), hidden.numel() / hidden_size(), logits);
}

Status Glm5NextCpuInstance::sample_drafts(const DraftSampleRequest& request) {
  return sample_drafts_host(request, vocab_size());
}

}  // namespace kiln::glm5_next
