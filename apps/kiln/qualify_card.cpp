#include "qualify_card.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "build_info.h"
#include "qualify_evidence.h"
#include "utf8_prefix.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

// A table cell: no newlines or pipes, and not a page long.
std::string cell(std::string s, size_t max = 200) {
  for (char& c : s)
    if (c == '\n' || c == '|') c = c == '|' ? '/' : ' ';
  return s.size() > max ? utf8_prefix(s, max) + "…" : s;
}

std::string gate_cell(const GateResult* g) {
  if (!g) return "—";
  if (g->outcome == GateResult::Outcome::kSkipped) return "skipped";
  return std::string(g->outcome_text()) + " " + std::to_string(g->passed) + "/" + std::to_string(g->total);
}

std::string gpu_text(const json& gpu) {
  if (gpu.is_string()) return gpu.get<std::string>();
  std::string out;
  for (const auto& g : gpu)
    out += (out.empty() ? "" : ", ") + g.value("name", "") + " (driver " + g.value("driver", "") + ")";
  return out;
}

std::string plugins_text(const json& plugins) {
  std::string out;
  for (const auto& p : plugins) out += (out.empty() ? "" : ", ") + p.value("name", "") + " " + p.value("version", "");
  return out.empty() ? "none loaded (built-ins only)" : out;
}

void arm_sections(std::ostringstream& md, const QualifyRun& run) {
  md << "\n## " << run.label << ": `" << run.recipe_file << "`\n\n";
  if (!run.error.empty()) md << "**Stopped early:** " << cell(run.error, 2000) << "\n\n";
  md << "server: " << run.server << "\n\n";
  md << "model `" << run.model << "`, max_model_len " << run.max_model_len << " · capacity: " << run.capacity;
  if (!run.server_exit.empty()) md << " · server " << run.server_exit << " when stopped";
  md << "\n";
  if (const GateResult* needle = run.gate("needle"); needle && !needle->details.empty()) {
    md << "\n**Needle retrieval**\n\n| target depth | prompt tokens | needle at | result |\n|---|---|---|---|\n";
    for (const auto& c : needle->details)
      md << "| " << c.value("target_depth", 0) << " | " << c.value("prompt_tokens", 0) << " | "
         << fmt("%.0f%%", 100 * c.value("position", 0.0)) << " | "
         << (c.value("pass", false) ? "found" : "missed: " + cell(c.value("why", ""), 120)) << " |\n";
  }
  if (const GateResult* tools = run.gate("tools"); tools && !tools->details.empty()) {
    // Cases are "<kind> #<n>": one row per kind, in the order they ran.
    std::vector<std::string> kinds;
    std::map<std::string, std::pair<int, int>> counts;
    std::map<std::string, std::string> first_failure;
    for (const auto& c : tools->details) {
      const std::string name = c.value("case", "");
      const std::string kind = name.substr(0, name.find(" #"));
      if (!counts.count(kind)) kinds.push_back(kind);
      auto& [passed, total] = counts[kind];
      ++total;
      if (c.value("pass", false)) ++passed;
      else if (!first_failure.count(kind)) first_failure[kind] = c.value("why", "");
    }
    md << "\n**Tool calls by kind**\n\n| kind | passed | first failure |\n|---|---|---|\n";
    for (const auto& k : kinds)
      md << "| " << k << " | " << counts[k].first << "/" << counts[k].second << " | " << cell(first_failure[k], 160) << " |\n";
  }
  if (!run.depths.empty()) {
    md << "\n**Depth sweep**\n\n| depth | prompt tokens | TTFT s | decode tok/s | ITL median ms "
          "|\n|---|---|---|---|---|\n";
    for (const auto& d : run.depths) {
      if (!d.ok) {
        md << "| " << d.depth << " | failed: " << cell(d.error, 120) << " | | | |\n";
        continue;
      }
      md << "| " << d.depth << " | " << d.prompt_tokens << " | " << fmt("%.3f", d.ttft) << " | "
         << fmt("%.1f", d.decode_tok_s) << " | " << fmt("%.2f", d.itl.median * 1e3) << " |\n";
    }
  }
  if (!run.levels.empty()) {
    md << "\n**Concurrency sweep**\n\n| concurrency | requests | failed | output tok/s | TTFT median ms | TPOT median "
          "ms | E2E p99 ms |\n"
       << "|---|---|---|---|---|---|---|\n";
    for (const auto& l : run.levels)
      md << "| " << l.concurrency << " | " << l.requests << " | " << l.failed << " | "
         << fmt("%.1f", l.duration > 0 ? l.output_tokens / l.duration : 0) << " | " << fmt("%.1f", l.ttft.median * 1e3)
         << " | " << fmt("%.2f", l.tpot.median * 1e3) << " | " << fmt("%.1f", l.e2el.p99 * 1e3) << " |\n";
    for (const auto& l : run.levels)
      if (l.failed > 0) md << "\nconcurrency " << l.concurrency << ", first failure: " << cell(l.first_error, 300) << "\n";
  }
}

json arm_json(const QualifyRun& run) {
  json gates = json::array(), depths = json::array(), levels = json::array();
  for (const auto& g : run.gates) gates.push_back(g.to_json());
  for (const auto& d : run.depths) {
    json j = depth_json(d);
    if (!d.ok) j["error"] = d.error;
    depths.push_back(j);
  }
  for (const auto& l : run.levels) levels.push_back(level_json(l));
  return {{"label", run.label},
          {"recipe", run.recipe},
          {"checkpoint", run.checkpoint},
          {"model", run.model},
          {"max_model_len", run.max_model_len},
          {"capacity", run.capacity},
          {"gates", gates},
          {"depth_sweep", depths},
          {"concurrency_sweep", levels},
          {"error", run.error},
          {"server_exit", run.server_exit},
          {"decode_tok_s", run.decode_tok_s()},
          {"ttft_s", run.ttft_s()}};
}

}  // namespace

std::string result_card(const QualifyReport& r) {
  const QualifyRun& cand = *r.candidate;
  std::ostringstream md;
  md << "# kiln qualify: `" << cand.recipe_file << "`\n\n"
     << r.date << " · kiln " << build_commit() << " · GPU: " << gpu_text(r.gpu) << " · `" << r.command << "`\n\n"
     << "plugins: " << plugins_text(r.plugins) << "\n\n"
     << "**Decision: " << r.decision.verdict << "**";
  if (r.incumbent) md << " (against `" << r.incumbent->recipe_file << "`)";
  md << "\n\n";
  for (const auto& reason : r.decision.reasons) md << "- " << cell(reason, 400) << "\n";

  md << "\n## Gates\n\n| gate | " << cand.label << " | ";
  if (r.incumbent) md << r.incumbent->label << " | ";
  md << "reason |\n|---|---|" << (r.incumbent ? "---|" : "") << "---|\n";
  for (const auto& g : cand.gates) {
    md << "| " << g.name << " | " << gate_cell(&g) << " | ";
    if (r.incumbent) md << gate_cell(r.incumbent->gate(g.name)) << " | ";
    md << cell(g.reason, 300) << " |\n";
  }
  if (r.incumbent) {
    md << "\n| measure (lone request) | " << cand.label << " | " << r.incumbent->label << " |\n|---|---|---|\n"
       << "| decode tok/s | " << fmt("%.1f", cand.decode_tok_s()) << " | " << fmt("%.1f", r.incumbent->decode_tok_s())
       << " |\n"
       << "| TTFT ms | " << fmt("%.1f", cand.ttft_s() * 1e3) << " | " << fmt("%.1f", r.incumbent->ttft_s() * 1e3)
       << " |\n";
  }
  arm_sections(md, cand);
  if (r.incumbent) arm_sections(md, *r.incumbent);
  md << "\n## Evidence\n\nThe manifest beside this card (same name, `.json`) holds the SHA-256 of this card, of every "
        "log and "
        "transcript the run wrote and of the recipe files, the checkpoint's revision, the plugins, commit, GPU and "
        "date.\n";
  return md.str();
}

json evidence_manifest(const QualifyReport& r, const std::vector<std::string>& artifacts) {
  json files = json::array();
  for (const auto& a : artifacts) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(a, ec);
    files.push_back({{"path", a}, {"sha256", sha256_file(a)}, {"bytes", ec ? 0 : bytes}});
  }
  json arms = json::array({arm_json(*r.candidate)});
  if (r.incumbent) arms.push_back(arm_json(*r.incumbent));
  return {{"kind", "kiln qualify evidence"},
          {"date", r.date},
          {"command", r.command},
          {"commit", build_commit()},
          {"gpu", r.gpu},
          {"recipe_sha256", r.candidate->recipe.value("sha256", "")},
          {"resolved_recipe_sha256", r.candidate->recipe.value("resolved_sha256", "")},
          {"checkpoint", r.candidate->checkpoint},
          {"plugins", r.plugins},
          {"capabilities", r.capabilities},
          {"decision", {{"verdict", r.decision.verdict}, {"reasons", r.decision.reasons}}},
          {"arms", arms},
          {"artifacts", files}};
}

}  // namespace kiln::cli
