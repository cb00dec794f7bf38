// "Did you mean …?" suggestions for misspelled keys and names.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln {

size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, if it is close enough to be a plausible typo. For dotted keys
// ("spec.depth") a candidate whose last component matches and whose section starts alike also counts.
std::optional<std::string> closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kiln
