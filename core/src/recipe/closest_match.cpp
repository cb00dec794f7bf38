#include "recipe/closest_match.h"


#include <algorithm>
#include <limits>

namespace kiln {

// Optimal-string-alignment distance: like Levenshtein, but a swap of two neighbours ("cdua") costs 1,
// the commonest typo in keys.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

namespace {

std::pair<std::string, std::string> split_last(const std::string& s) {
  size_t dot = s.rfind('.');
  if (dot == std::string::npos) return {"", s};
  return {s.substr(0, dot), s.substr(dot + 1)};
}

bool sections_alike(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a == b;
  return a.rfind(b, 0) == 0 || b.rfind(a, 0) == 0 || edit_distance(a, b) <= 2;
}

}  // namespace

std::optional<std::string> closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_cost = std::numeric_limits<size_t>::max();
  auto [w_section, w_key] = split_last(word);
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    auto [c_section, c_key] = split_last(c);
    // Same key under a misspelled or abbreviated section ("spec.depth" → "speculative.depth").
    if (!w_section.empty() && w_key == c_key && sections_alike(w_section, c_section)) d = std::min<size_t>(d, 1);
    // The right key in the wrong section ("kv.depth" → "speculative.depth") is still worth naming.
    else if (!w_section.empty() && w_key == c_key) d = std::min<size_t>(d, 3);
    if (d < best_cost) {
      best_cost = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 3);
  if (best && best_cost <= limit) return best;
  return std::nullopt;
}

}  // namespace kiln
