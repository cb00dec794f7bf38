#include "engine/speculative_generator.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "engine/speculative_sampling.h"

namespace kiln {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

SpeculativeGenerator::SpeculativeGenerator(const MlaMoeModel& model, KvCache& kv, Drafter& drafter, int depth,
                                           int64_t seq_id, ModelRunner* runner)
    : model_(model),
      kv_(kv),
      runner_(runner),
      drafter_(drafter),
      depth_(std::clamp(depth, 0, drafter.capabilities().max_depth)),
      seq_id_(seq_id) {}

SpeculativeGenerator::~SpeculativeGenerator() { reset(); }

void SpeculativeGenerator::reset() {
  kv_.release(table_);
  if (drafter_has_sequence_) drafter_.release(seq_id_);
  drafter_has_sequence_ = false;
}

Result<std::vector<int32_t>> SpeculativeGenerator::generate(const std::vector<int32_t>& prompt,
                                                            const GenerateOptions& options,
                                                            const std::function<bool(int32_t)>& on_token,
                                                            GenerateStats* stats) {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  reset();
  const ModelConfig& c = model_.config();
  const int64_t vocab = c.vocab_size, H = c.hidden_size;
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (c.max_position_embeddings > 0 && P + options.max_new_tokens > c.max_position_embeddings)
    return out_of_range("prompt (" + std::to_string(P) + " tokens) + max_new_tokens (" +
                        std::to_string(options.max_new_tokens) + ") exceeds the model's context of " +
                        std::to_string(c.max_position_embeddings) + " tokens");
  const bool greedy = options.sampling.temperature <= 0.0f;
  cpu::SamplingParams params;
  params.temperature = options.sampling.temperature;
  params.top_k = options.sampling.top_k;
  params.top_p = options.sampling.top_p;
  std::mt19937_64 rng(options.sampling.seed);

  GenerateStats st;
  st.prompt_tokens = P;
  auto t0 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(kv_.reserve(table_, P));
  // Rows the target ran since the drafter last saw the sequence: their tokens and final-normed hidden states.
  std::vector<int32_t> new_tokens;
  std::vector<float> new_hidden;
  int64_t new_start = 0;
  StepOutput out;
  auto forward = [&](const SequenceStep& step) {
    return runner_ ? runner_->forward({&step, 1}, out, depth_ > 0) : model_.forward({&step, 1}, kv_, out, depth_ > 0);
  };
  const int64_t chunk = std::max<int64_t>(1, options.prefill_chunk);
  for (int64_t begin = 0; begin < P; begin += chunk) {
    const int64_t n = std::min(chunk, P - begin);
    SequenceStep step{std::span<const int32_t>(prompt.data() + begin, n), begin, &table_, false};
    KILN_RETURN_IF_ERROR(forward(step));
    new_hidden.insert(new_hidden.end(), out.hidden.begin(), out.hidden.end());
  }
  new_tokens = prompt;
  st.prefill_seconds = seconds_since(t0);

  std::vector<int32_t> generated;
  bool done = false;
  // Emits one token; false once generation is over (stop token, consumer gone, or budget reached).
  auto emit = [&](int32_t token) {
    generated.push_back(token);
    const bool stop =
        std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
    if ((on_token && !on_token(token)) || stop) {
      st.stopped_by_token = stop;
      done = true;
    }
    if (static_cast<int64_t>(generated.size()) >= options.max_new_tokens) done = true;
    return !done;
  };

  auto t1 = std::chrono::steady_clock::now();
  if (options.max_new_tokens > 0)
    emit(greedy ? cpu::argmax(out.logits.data(), vocab) : cpu::sample(out.logits.data(), vocab, params, rng));
  else
    done = true;
  int64_t length = P;  // positions the target's KV holds; generated.back() is the token at `length`
  while (!done) {
    // Each pass emits at least one target token: never draft beyond what the budget can still take.
    const int64_t remaining = options.max_new_tokens - static_cast<int64_t>(generated.size());
    const int k_max = static_cast<int>(std::min<int64_t>(depth_, remaining - 1));
    std::vector<int32_t> pass{generated.back()};
    DraftOutput draft;
    if (k_max > 0) {
      DraftInput in;
      in.seq_id = seq_id_;
      in.start_position = new_start;
      in.tokens = new_tokens.data();
      in.num_tokens = static_cast<int64_t>(new_tokens.size());
      in.target_hidden = new_hidden.data();
      in.next_token = generated.back();
      in.temperature = greedy ? 0.0f : options.sampling.temperature;
      in.seed = options.sampling.seed;
      std::vector<DraftOutput> drafts;
      drafter_has_sequence_ = true;
      KILN_RETURN_IF_ERROR(drafter_.propose({in}, k_max, drafts));
      draft = std::move(drafts.at(0));
      if (static_cast<int64_t>(draft.tokens.size()) > k_max) draft.tokens.resize(k_max);
      pass.insert(pass.end(), draft.tokens.begin(), draft.tokens.end());
    }
    const int64_t K = static_cast<int64_t>(pass.size()) - 1;
    KILN_RETURN_IF_ERROR(kv_.reserve(table_, length + K + 1));
    SequenceStep step{pass, length, &table_, /*all_logits=*/true};
    KILN_RETURN_IF_ERROR(forward(step));

    std::span<const int32_t> drafts(pass.data() + 1, K);
    const bool have_q = !greedy && static_cast<int64_t>(draft.probs.size()) == K * vocab;
    Verification v = greedy ? verify_greedy(out.logits.data(), vocab, drafts)
                            : verify_sampling(out.logits.data(), vocab, drafts, have_q ? draft.probs.data() : nullptr,
                                              params, rng);
    metrics_.record(K, v.accepted);

    // The target's rows now valid: the newest token and the accepted drafts (positions length .. length + a).
    const int64_t a = v.accepted;
    new_start = length;
    new_tokens.assign(pass.begin(), pass.begin() + a + 1);
    if (depth_ > 0) new_hidden.assign(out.hidden.begin(), out.hidden.begin() + (a + 1) * H);
    length += a + 1;
    if (drafter_has_sequence_) KILN_RETURN_IF_ERROR(drafter_.rollback(seq_id_, length));
    for (int32_t t : v.tokens)
      if (!emit(t)) break;
  }
  st.decode_seconds = seconds_since(t1);
  st.generated_tokens = static_cast<int64_t>(generated.size());
  if (stats) *stats = st;
  return generated;
}

}  // namespace kiln
