// Constrained decoding's seam in the engine: a per-request automaton (a grammar matcher) that says which tokens may
// come next, follows the tokens the request accepts, and can step back over tokens it was shown only to compute the
// masks of a verification pass. The engine knows nothing of grammars; the server builds constraints
// (server/structured_output.h) and the engine applies them to every row it selects from.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace kiln {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next as a bitmask of token_mask_words(vocab) words (model/model_step.h); bits past the
  // constraint's own vocabulary are cleared. Not called once terminated().
  virtual void fill_allowed(std::span<uint32_t> mask) = 0;
  // Advances over `token`; false (and no change) when it is not allowed.
  virtual bool accept(int32_t token) = 0;
  // Undoes the last `num_tokens` accepted tokens.
  virtual void rollback(int num_tokens) = 0;
  // A stop token was accepted: the constrained text is complete.
  virtual bool terminated() const = 0;
  // The same constraint at its start state, for another sequence of the same request (n > 1); null when it cannot
  // be had (the request is then refused).
  virtual std::shared_ptr<TokenConstraint> fresh() const { return nullptr; }
};

}  // namespace kiln
