#include "qualify_decision.h"

#include <algorithm>
#include <cstdio>

#include "utf8_prefix.h"

namespace kiln::cli {
namespace {

std::string pct(double ratio) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", (ratio - 1.0) * 100.0);
  return b;
}

// An error's first line and, when it quotes a log, the log's last line: what a reader needs in one line.
std::string gist(const std::string& error) {
  const std::string first = error.substr(0, error.find('\n'));
  std::string rest = error.substr(std::min(error.size(), first.size() + 1));
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.pop_back();
  if (rest.empty()) return first;
  const size_t nl = rest.rfind('\n');
  std::string last = nl == std::string::npos ? rest : rest.substr(nl + 1);
  last.erase(0, last.find_first_not_of(' '));
  return first + " " + last;
}

}  // namespace

Decision decide(const QualifyRun& cand, const QualifyRun* inc, double tolerance) {
  Decision d;
  if (!cand.error.empty()) {
    d.verdict = "reject";
    d.reasons.push_back("the qualification did not complete: " + gist(cand.error));
    return d;
  }
  std::vector<std::string> failed, not_run, regressed;
  for (const auto& g : cand.gates) {
    if (g.outcome == GateResult::Outcome::kFail) {
      failed.push_back(g.name);
      d.reasons.push_back(g.name + " failed (" + std::to_string(g.passed) + "/" + std::to_string(g.total) +
                          "): " + utf8_prefix(g.reason, 160));
      const GateResult* other = inc ? inc->gate(g.name) : nullptr;
      if (other && other->outcome == GateResult::Outcome::kPass) regressed.push_back(g.name);
    } else if (g.not_run) {
      not_run.push_back(g.name);
    }
  }
  for (const auto& n : not_run) d.reasons.push_back(n + " was not run: promotion needs every applicable gate");
  const bool all_pass = failed.empty() && not_run.empty();

  if (!inc) {
    d.verdict = all_pass ? "promote" : failed.empty() ? "challenger" : "reject";
    if (all_pass)
      d.reasons.insert(d.reasons.begin(), "all " + std::to_string(cand.gates_applicable()) + " applicable gates pass");
    return d;
  }
  if (!inc->error.empty()) {
    d.verdict = all_pass ? "promote" : "reject";
    d.reasons.push_back("the incumbent could not be measured, so nothing is compared: " + gist(inc->error));
    return d;
  }
  if (!regressed.empty()) {
    std::string list;
    for (const auto& r : regressed) list += (list.empty() ? "" : ", ") + r;
    d.verdict = "reject";
    d.reasons.insert(d.reasons.begin(), "fails gates the incumbent passes: " + list);
    return d;
  }
  // Speed: a lone request's decode tok/s (higher is better) and TTFT (lower is better).
  bool measured = cand.decode_tok_s() > 0 && inc->decode_tok_s() > 0 && cand.ttft_s() > 0 && inc->ttft_s() > 0;
  bool faster = false, slower = false;
  if (measured) {
    const double decode = cand.decode_tok_s() / inc->decode_tok_s(), ttft = cand.ttft_s() / inc->ttft_s();
    faster = decode > 1 + tolerance || ttft < 1 - tolerance;
    slower = decode < 1 - tolerance || ttft > 1 + tolerance;
    d.reasons.push_back("decode tok/s " + pct(decode) + ", TTFT " + pct(ttft) + " against the incumbent (tolerance ±" +
                        pct(1 + tolerance).substr(1) + ")");
  } else {
    d.reasons.push_back("speed not compared: the concurrency sweep of one arm measured nothing");
  }
  if (all_pass) {
    if (!slower)
      d.verdict = "promote";
    else if (faster)
      d.verdict = "challenger";
    else
      d.verdict = "reject";
    d.reasons.insert(d.reasons.begin(), std::string("all applicable gates pass; ") +
                                            (!slower  ? "no slower than the incumbent"
                                             : faster ? "faster on one measure, slower on the other"
                                                      : "slower than the incumbent"));
  } else {
    d.verdict = faster && !slower ? "challenger" : "reject";
    d.reasons.insert(d.reasons.begin(),
                     d.verdict == "challenger"
                         ? "faster than the incumbent, but not every gate passes (none that the incumbent passes fails)"
                         : "not every gate passes and it is not faster than the incumbent");
  }
  return d;
}

}  // namespace kiln::cli
