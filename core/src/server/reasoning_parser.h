// The "glm45" reasoning parser: GLM-4.5/4.7/5 think inside <think>…</think>. With thinking on, the prompt already
// ends with <think>, so generated text is reasoning until </think> and the answer after it. A <think> the model
// repeats at the very start is dropped; an answer that starts with <think> while thinking is off opens reasoning too.
#pragma once

#include <string>
#include <string_view>

#include "server/output_piece.h"

namespace kiln {

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning) : in_reasoning_(starts_in_reasoning) {}

  OutputPieces feed(std::string_view text);
  OutputPieces flush();

 private:
  bool in_reasoning_;
  bool at_start_ = true;  // nothing emitted yet in the current section
  std::string pending_;
};

}  // namespace kiln
