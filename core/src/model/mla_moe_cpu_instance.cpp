#include "model/mla_moe_cpu_instance.h"

#include <string>

#include "model/host_model_args.h"
#include "model/host_token_select.h"

namespace kiln {

Result<std::unique_ptr<MlaMoeCpuInstance>> MlaMoeCpuInstance::create(const ModelConfig& config, const BuildContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ModelWeights weights,
                        load_model_weights(config, *ctx.source, *ctx.format, ctx.load_mtp, ctx.precision));
  auto model = std::make_unique<MlaMoeModel>(config, std::move(weights));
  model->set_threads(ctx.threads);
  model->set_collective(ctx.collective);
  return std::unique_ptr<MlaMoeCpuInstance>(new MlaMoeCpuInstance(std::move(model), *ctx.device));
}

Status MlaMoeCpuInstance::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
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

Status MlaMoeCpuInstance::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                   const CacheViews& caches, MtpStepOutput& out) {
  KILN_RETURN_IF_ERROR(model_->mtp_forward(layer, steps, hidden, caches, mtp_out_));
  out.logits = mtp_out_.logits.data();
  out.first_row = mtp_out_.first_row;
  out.hidden = mtp_out_.hidden.data();
  return ok_status();
}

Status MlaMoeCpuInstance::embed(const int32_t* ids, int64_t n, TensorView out) {
  KILN_RETURN_IF_ERROR(check_host_embed_args(ids, n, out, vocab_size(), hidden_size()));
  model_->embed(ids, n, out.as<float>());
  return ok_status();
}

Status MlaMoeCpuInstance::lm_head(const TensorView& hidden, float* logits) {
  KILN_RETURN_IF_ERROR(check_host_lm_head_args(hidden, hidden_size()));
  return model_->lm_head(hidden.as<float>(), hidden.numel() / hidden_size(), logits);
}

Status MlaMoeCpuInstance::sample_drafts(const DraftSampleRequest& request) {
  return sample_drafts_host(request, vocab_size());
}

}  // namespace kiln
