#include "recipe/toml_key_depth.h"

namespace kiln {
namespace {

// Scans TOML text line by line, tracking multi-line strings; in each line's key part (a table header, or what comes
// before the first `=` outside strings) counts the dots outside strings.
class KeyDepthScan {
 public:
  explicit KeyDepthScan(std::string_view text) : text_(text) {}

  // The first line (1-based) whose key has more than `limit` parts, or 0.
  int first_too_deep(int limit) {
    int line = 1;
    while (i_ < text_.size()) {
      if (!multiline_.empty()) {  // inside a multi-line string: find its end
        const size_t end = text_.find(multiline_, i_);
        const size_t stop = end == std::string_view::npos ? text_.size() : end + multiline_.size();
        for (size_t j = i_; j < stop; ++j) line += text_[j] == '\n';
        i_ = stop;
        multiline_.clear();
        continue;
      }
      if (parts_in_key_of_line() > limit) return line;
      // Skip the rest of the line (its value), opening a multi-line string if one starts there.
      while (i_ < text_.size() && text_[i_] != '\n') {
        if (opens_multiline()) break;
        if (text_[i_] == '"' || text_[i_] == '\'') {
          i_ = string_end(i_);
          continue;
        }
        if (text_[i_] == '#') {
          while (i_ < text_.size() && text_[i_] != '\n') ++i_;
          break;
        }
        ++i_;
      }
      if (!multiline_.empty()) continue;
      if (i_ < text_.size()) ++i_, ++line;
    }
    return 0;
  }

 private:
  bool opens_multiline() {
    for (const char* q : {"\"\"\"", "'''"})
      if (text_.substr(i_, 3) == q) {
        multiline_ = q;
        i_ += 3;
        return true;
      }
    return false;
  }

  // Where the one-line string opening at `pos` ends (a basic string's escapes included): after its closing quote,
  // or at the end of the line.
  size_t string_end(size_t pos) const {
    const char q = text_[pos++];
    while (pos < text_.size() && text_[pos] != '\n' && text_[pos] != q) pos += q == '"' && text_[pos] == '\\' ? 2 : 1;
    return pos < text_.size() && text_[pos] == q ? pos + 1 : pos;
  }

  // Counts the parts of the key that starts the line at i_, leaving i_ after it (at `=` or `]`), or where nothing
  // key-like starts (a value line of a multi-line array), at the line's start. Returns 1 for a line with no key.
  int parts_in_key_of_line() {
    const size_t start = i_;
    while (i_ < text_.size() && (text_[i_] == ' ' || text_[i_] == '\t')) ++i_;
    const bool header = i_ < text_.size() && text_[i_] == '[';
    int dots = 0;
    for (size_t j = i_ + (header ? 1 : 0); j < text_.size() && text_[j] != '\n';) {
      const char c = text_[j];
      if (c == '"' || c == '\'') {
        if (text_.substr(j, 3) == "\"\"\"" || text_.substr(j, 3) == "'''") break;  // a value's multi-line string
        j = string_end(j);
        continue;
      }
      if (c == '.') ++dots;
      // Where the key ends: `=` for a key/value, `]` for a header. A `,` or `#` first means no key on this line.
      if ((!header && c == '=') || (header && c == ']')) return dots + 1;
      if (c == ',' || c == '#' || c == '{') break;
      ++j;
    }
    i_ = start;
    return 1;
  }

  std::string_view text_;
  size_t i_ = 0;
  std::string multiline_;
};

}  // namespace

Status check_toml_key_depth(std::string_view text, const std::string& source) {
  const int line = KeyDepthScan(text).first_too_deep(kMaxRecipeKeyParts);
  if (line == 0) return ok_status();
  return invalid_argument(source + ":" + std::to_string(line) + ": a key of more than " +
                          std::to_string(kMaxRecipeKeyParts) + " dot-separated parts: no recipe key nests that deep");
}

}  // namespace kiln
