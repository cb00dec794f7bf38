// The decision rules of `kiln qualify` (docs/qualify.md): promote, challenger or reject, with and without an incumbent.
#include "qualify_decision.h"

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

using Outcome = GateResult::Outcome;

GateResult gate(const std::string& name, Outcome outcome, bool not_run = false) {
  GateResult g;
  g.name = name;
  g.outcome = outcome;
  g.not_run = not_run;
  g.total = outcome == Outcome::kSkipped ? 0 : 20;
  g.passed = outcome == Outcome::kPass ? 20 : 0;
  if (outcome != Outcome::kPass) g.reason = "because";
  return g;
}

// A run with the given gates whose lone request decodes at `decode` tok/s with a TTFT of `ttft` s.
QualifyRun run(std::vector<GateResult> gates, double decode = 100, double ttft = 0.5) {
  QualifyRun r;
  r.gates = std::move(gates);
  LevelResult level;
  level.concurrency = 1;
  level.tpot.mean = 1.0 / decode;
  level.ttft.median = ttft;
  r.levels.push_back(level);
  return r;
}

const auto kPass = Outcome::kPass;
const auto kFail = Outcome::kFail;
const auto kSkipped = Outcome::kSkipped;

TEST(QualifyDecision, AloneEveryApplicableGateMustPass) {
  EXPECT_EQ(decide(run({gate("smoke", kPass), gate("images", kSkipped)}), nullptr, 0.03).verdict, "promote");
  Decision d = decide(run({gate("smoke", kPass), gate("needle", kFail)}), nullptr, 0.03);
  EXPECT_EQ(d.verdict, "reject");
  ASSERT_FALSE(d.reasons.empty());
  EXPECT_EQ(d.reasons[0], "needle failed (0/20): because");
  // Gates left out by --gates: nothing failed, but nothing proves them either.
  EXPECT_EQ(decide(run({gate("smoke", kPass), gate("tools", kSkipped, true)}), nullptr, 0.03).verdict, "challenger");
}

TEST(QualifyDecision, AnIncompleteRunIsRejected) {
  QualifyRun r = run({gate("smoke", kPass)});
  r.error = "the server was killed by signal 9 (Killed) during the tools gate; its log ends:\n  a\n  last line\n";
  Decision d = decide(r, nullptr, 0.03);
  EXPECT_EQ(d.verdict, "reject");
  EXPECT_EQ(d.reasons[0],
            "the qualification did not complete: the server was killed by signal 9 (Killed) during the "
            "tools gate; its log ends: last line");
}

TEST(QualifyDecision, AGateTheIncumbentPassesMustNotRegress) {
  QualifyRun inc = run({gate("smoke", kPass), gate("tools", kPass)});
  Decision d = decide(run({gate("smoke", kPass), gate("tools", kFail)}, 500, 0.1), &inc, 0.03);
  EXPECT_EQ(d.verdict, "reject");  // however much faster
  EXPECT_EQ(d.reasons[0], "fails gates the incumbent passes: tools");
}

TEST(QualifyDecision, SpeedDecidesBetweenRecipesThatPassTheSameGates) {
  QualifyRun inc = run({gate("smoke", kPass)}, 100, 0.5);
  EXPECT_EQ(decide(run({gate("smoke", kPass)}, 120, 0.5), &inc, 0.03).verdict, "promote");
  EXPECT_EQ(decide(run({gate("smoke", kPass)}, 101, 0.505), &inc, 0.03).verdict, "promote");   // within tolerance
  EXPECT_EQ(decide(run({gate("smoke", kPass)}, 120, 0.8), &inc, 0.03).verdict, "challenger");  // a trade-off
  EXPECT_EQ(decide(run({gate("smoke", kPass)}, 80, 0.5), &inc, 0.03).verdict, "reject");
}

TEST(QualifyDecision, FailingAGateBothFailLeavesAtMostChallenger) {
  QualifyRun inc = run({gate("smoke", kPass), gate("needle", kFail)}, 100, 0.5);
  EXPECT_EQ(decide(run({gate("smoke", kPass), gate("needle", kFail)}, 130, 0.4), &inc, 0.03).verdict, "challenger");
  EXPECT_EQ(decide(run({gate("smoke", kPass), gate("needle", kFail)}, 100, 0.5), &inc, 0.03).verdict, "reject");
}

TEST(QualifyDecision, AnIncumbentThatCouldNotBeMeasuredLeavesTheCandidateOnItsOwnGates) {
  QualifyRun inc;
  inc.error = "`kiln serve x.toml` exited with status 1 before it listened";
  Decision d = decide(run({gate("smoke", kPass)}), &inc, 0.03);
  EXPECT_EQ(d.verdict, "promote");
  EXPECT_NE(d.reasons.back().find("the incumbent could not be measured"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cli
