#include "engine/engine_config.h"

#include <limits>
#include <string>

namespace kiln {

Status EngineConfig::validate() const {
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v > 0) return ok_status();
    return invalid_argument(std::string("engine: ") + name + " must be positive, got " + std::to_string(v));
  };
  KILN_RETURN_IF_ERROR(positive(max_model_len, "max_model_len"));
  KILN_RETURN_IF_ERROR(positive(max_num_seqs, "max_num_seqs"));
  KILN_RETURN_IF_ERROR(positive(max_num_batched_tokens, "max_num_batched_tokens"));
  KILN_RETURN_IF_ERROR(positive(max_waiting, "max_waiting"));
  KILN_RETURN_IF_ERROR(positive(num_blocks, "num_blocks"));
  KILN_RETURN_IF_ERROR(positive(block_size, "block_size"));
  if (lookahead_slots < 0) return invalid_argument("engine: lookahead_slots must not be negative");
  if (max_chunk_tokens < 0) return invalid_argument("engine: max_chunk_tokens must not be negative");
  if (lone_prompt_tokens < 0) return invalid_argument("engine: lone_prompt_tokens must not be negative");
  // Decodes are scheduled before anything else and never split; a step must fit one token per sequence.
  if (max_num_batched_tokens < max_num_seqs)
    return invalid_argument("scheduler.max_num_batched_tokens (" + std::to_string(max_num_batched_tokens) +
                            ") must be at least scheduler.max_num_seqs (" + std::to_string(max_num_seqs) +
                            ") so every running sequence can decode in one step");
  return ok_status();
}

Result<EngineConfig> engine_config_from_recipe(const RecipeSection& s, int64_t model_max_len) {
  EngineConfig c;
  c.max_model_len = s.get_int("max_model_len", 0);
  if (c.max_model_len == 0) c.max_model_len = model_max_len;
  if (model_max_len > 0 && c.max_model_len > model_max_len)
    return s.error("max_model_len", std::to_string(c.max_model_len) + " is beyond the model's " +
                                        std::to_string(model_max_len) + " positions (max_position_embeddings)");
  if (c.max_model_len <= 0)
    return s.error("max_model_len", "is 0 and the model does not state max_position_embeddings; set it");
  // Positions, block tables and slots are 32-bit on every path (the kernels' int32 positions).
  constexpr int64_t kMaxPositions = std::numeric_limits<int32_t>::max();
  if (c.max_model_len > kMaxPositions)
    return s.error("max_model_len", std::to_string(c.max_model_len) + (s.get_int("max_model_len", 0) == 0
                                                                           ? " (the model's max_position_embeddings)"
                                                                           : std::string()) +
                                        " is beyond the 2,147,483,647 positions kiln addresses; set it lower");
  c.max_num_seqs = s.get_int("max_num_seqs", c.max_num_seqs);
  c.max_num_batched_tokens = s.get_int("max_num_batched_tokens", c.max_num_batched_tokens);
  c.prefix_caching = s.get_bool("prefix_caching", c.prefix_caching);
  c.max_waiting = s.get_int("max_waiting", c.max_waiting);
  c.batch_invariant = s.get_bool("batch_invariant", c.batch_invariant);
  c.lone_prompt_tokens = s.get_int("lone_prompt_tokens", c.lone_prompt_tokens);
  if (c.lone_prompt_tokens > c.max_model_len)
    return s.error("lone_prompt_tokens", std::to_string(c.lone_prompt_tokens) + " is beyond max_model_len (" +
                                             std::to_string(c.max_model_len) + "): no prompt is that long");
  if (c.max_num_batched_tokens < c.max_num_seqs)
    return s.error("max_num_batched_tokens", std::to_string(c.max_num_batched_tokens) + " is below max_num_seqs (" +
                                                 std::to_string(c.max_num_seqs) +
                                                 "): every running sequence must be able to decode in one step");
  return c;
}

}  // namespace kiln
