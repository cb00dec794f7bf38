// GateResult (qualify_gates.h): how a gate's cases add up to its outcome and reason.
#include "qualify_gates.h"

namespace kiln::cli {

void GateResult::finish() {
  if (outcome == Outcome::kSkipped) return;
  outcome = total > 0 && passed == total ? Outcome::kPass : Outcome::kFail;
  if (outcome == Outcome::kFail && reason.empty()) {
    for (const auto& d : details)
      if (!d.value("pass", false)) {
        reason = d.value("case", std::string("a case")) + ": " + d.value("why", std::string("failed"));
        break;
      }
    if (reason.empty()) reason = "no case ran";
  }
}

const char* GateResult::outcome_text() const {
  switch (outcome) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kSkipped:
      return "skipped";
    default:
      return "FAIL";
  }
}

nlohmann::json GateResult::to_json() const {
  return {{"gate", name},   {"outcome", outcome_text()}, {"passed", passed},
          {"total", total}, {"reason", reason},          {"cases", details}};
}

}  // namespace kiln::cli
