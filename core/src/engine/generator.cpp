#include "engine/generator.h"

#include <algorithm>
#include <chrono>

namespace kiln {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Result<std::vector<int32_t>> Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                                 const std::function<bool(int32_t)>& on_token, GenerateStats* stats) {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  kv_.release(table_);
  const int64_t vocab = model_.config().vocab_size;
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (model_.config().max_position_embeddings > 0 && total > model_.config().max_position_embeddings)
    return out_of_range("prompt (" + std::to_string(prompt.size()) + " tokens) + max_new_tokens (" +
                        std::to_string(options.max_new_tokens) + ") exceeds the model's context of " +
                        std::to_string(model_.config().max_position_embeddings) + " tokens");
  KILN_RETURN_IF_ERROR(kv_.reserve(table_, static_cast<int64_t>(prompt.size())));

  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  Sampler sampler(options.sampling);
  StepOutput out;
  auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = std::max<int64_t>(1, options.prefill_chunk);
  for (int64_t begin = 0; begin < st.prompt_tokens; begin += chunk) {
    const int64_t n = std::min(chunk, st.prompt_tokens - begin);
    SequenceStep step{std::span<const int32_t>(prompt.data() + begin, n), begin, &table_, false};
    KILN_RETURN_IF_ERROR((runner_ ? runner_->forward({&step, 1}, out, false) : model_.forward({&step, 1}, kv_, out)));
  }
  st.prefill_seconds = seconds_since(t0);

  std::vector<int32_t> generated;
  auto t1 = std::chrono::steady_clock::now();
  int64_t pos = st.prompt_tokens;
  while (static_cast<int64_t>(generated.size()) < options.max_new_tokens) {
    const int32_t next = sampler.next(out.logits.data(), vocab);
    generated.push_back(next);
    const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) != options.stop_tokens.end();
    if (on_token && !on_token(next)) break;
    if (stop) {
      st.stopped_by_token = true;
      break;
    }
    if (static_cast<int64_t>(generated.size()) == options.max_new_tokens) break;
    KILN_RETURN_IF_ERROR(kv_.reserve(table_, pos + 1));
    SequenceStep step{std::span<const int32_t>(&generated.back(), 1), pos, &table_, false};
    KILN_RETURN_IF_ERROR((runner_ ? runner_->forward({&step, 1}, out, false) : model_.forward({&step, 1}, kv_, out)));
    ++pos;
  }
  st.decode_seconds = seconds_since(t1);
  st.generated_tokens = static_cast<int64_t>(generated.size());
  if (stats) *stats = st;
  return generated;
}

}  // namespace kiln
