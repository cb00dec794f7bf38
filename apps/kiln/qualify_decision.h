// The decision line of `kiln qualify` (rules in docs/qualify.md): promote, challenger or reject, with its reasons.
#pragma once

#include <string>
#include <vector>

#include "qualify_run.h"

namespace kiln::cli {

struct Decision {
  std::string verdict;  // "promote", "challenger", "reject"
  std::vector<std::string> reasons;
};

// `incumbent` null: promote only when every applicable gate ran and passed. With one: a gate the incumbent passes
// and the candidate fails rejects it; speed (decode tok/s and TTFT of a lone request) decides the rest, differences
// within `tolerance` (a fraction) counting as equal.
Decision decide(const QualifyRun& candidate, const QualifyRun* incumbent, double tolerance);

}  // namespace kiln::cli
