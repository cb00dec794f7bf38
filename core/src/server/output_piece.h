// What a request's generated text becomes after stop strings, reasoning split and tool-call parsing: an ordered
// list of pieces. Order matters (text before a tool call, reasoning before the answer), so routes emit pieces in
// sequence rather than per-kind buckets.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct OutputPiece {
  enum class Kind {
    kReasoning,          // text: reasoning (GLM: before </think>)
    kContent,            // text: the answer
    kToolCallStart,      // tool_index, tool_id, tool_name: a call begins (its name is complete)
    kToolCallArguments,  // tool_index, text: more of the call's arguments JSON string
  };
  Kind kind = Kind::kContent;
  std::string text;
  int tool_index = -1;
  std::string tool_id;
  std::string tool_name;
};

using OutputPieces = std::vector<OutputPiece>;

// Appends, merging into the last piece when it continues the same text stream (keeps SSE chunk counts low).
void append_piece(OutputPieces& pieces, OutputPiece piece);
void append_text(OutputPieces& pieces, OutputPiece::Kind kind, std::string text);
void append_pieces(OutputPieces& pieces, OutputPieces more);

// Index of the longest suffix of `text` that is a proper prefix of `marker` (text.size() when none): the part
// that must be held back because the next chunk may complete the marker.
size_t partial_marker_start(const std::string& text, const std::string& marker);

}  // namespace kiln
