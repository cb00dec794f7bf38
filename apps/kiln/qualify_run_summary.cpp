// QualifyRun's summaries (qualify_run.h): what the decision and the card read from a finished run.
#include <algorithm>

#include "qualify_run.h"

namespace kiln::cli {

double QualifyRun::decode_tok_s() const {
  if (levels.empty() || levels.front().tpot.mean <= 0) return 0;
  return 1.0 / levels.front().tpot.mean;
}
double QualifyRun::ttft_s() const {
  return levels.empty() ? 0 : levels.front().ttft.median;
}
int64_t QualifyRun::gates_passed() const {
  return std::count_if(gates.begin(), gates.end(),
                       [](const GateResult& g) { return g.outcome == GateResult::Outcome::kPass; });
}
int64_t QualifyRun::gates_applicable() const {
  return std::count_if(gates.begin(), gates.end(),
                       [](const GateResult& g) { return g.outcome != GateResult::Outcome::kSkipped; });
}
const GateResult* QualifyRun::gate(const std::string& name) const {
  for (const auto& g : gates)
    if (g.name == name) return &g;
  return nullptr;
}

}  // namespace kiln::cli
