#include "server/output_piece.h"

#include <algorithm>

namespace kiln {

void append_piece(OutputPieces& pieces, OutputPiece piece) {
  bool is_text = piece.kind == OutputPiece::Kind::kReasoning || piece.kind == OutputPiece::Kind::kContent ||
                 piece.kind == OutputPiece::Kind::kToolCallArguments;
  if (is_text && piece.text.empty()) return;
  if (is_text && !pieces.empty() && pieces.back().kind == piece.kind && pieces.back().tool_index == piece.tool_index) {
    pieces.back().text += piece.text;
    return;
  }
  pieces.push_back(std::move(piece));
}

void append_text(OutputPieces& pieces, OutputPiece::Kind kind, std::string text) {
  OutputPiece piece;
  piece.kind = kind;
  piece.text = std::move(text);
  append_piece(pieces, std::move(piece));
}

void append_pieces(OutputPieces& pieces, OutputPieces more) {
  for (auto& p : more) append_piece(pieces, std::move(p));
}

size_t partial_marker_start(const std::string& text, const std::string& marker) {
  size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t k = longest; k > 0; --k) {
    if (text.compare(text.size() - k, k, marker, 0, k) == 0) return text.size() - k;
  }
  return text.size();
}

}  // namespace kiln
