// `kiln qualify RECIPE [--against INCUMBENT]`: starts the recipe's server, runs the gates a serving campaign
// promotes on (smoke, strict JSON, tools, Responses API, needle retrieval, images), the depth and concurrency sweeps
// and the capacity report, then writes a result card, an evidence manifest and a decision (docs/qualify.md).
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "commands.h"
#include "json_text.h"
#include "qualify_card.h"
#include "qualify_evidence.h"
#include "qualify_run.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::cli {
namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  for (char c : text + ",") {
    if (c != ',') {
      item += c;
    } else if (!item.empty()) {
      out.push_back(item);
      item.clear();
    }
  }
  return out;
}

// Options that parse but make no sense: exit status 2, as for options the parser refuses.
int usage_error(const std::string& message) {
  fail(message);
  return 2;
}

}  // namespace

int cmd_qualify(int argc, char** argv) {
  CommonOptions common;
  QualifyOptions o;
  std::string recipe, against, out_prefix = "qualify-result", gates, needle_depths, sweep_depths, concurrency = "1,4,16";
  double tolerance = 0.03;
  po::options_description desc("kiln qualify options");
  desc.add_options()
      ("help,h", "show this help")
      ("recipe", po::value(&recipe), "the candidate recipe")
      ("against", po::value(&against), "the incumbent recipe: qualified the same way, then compared")
      ("out", po::value(&out_prefix)->default_value(out_prefix), "writes <out>.md, <out>.json and the logs beside them")
      ("port", po::value(&o.port)->default_value(0), "port of the server started here (0 = any free port)")
      ("base-url", po::value(&o.base_url), "drive this running server instead of starting one (not with --against)")
      ("api-key-env", po::value(&o.api_key_env), "environment variable holding the server's API key (default: the recipe's server.api_key_env)")
      ("set", po::value(&o.sets)->composing(), "override a recipe key for the server: section.key=value (repeatable)")
      ("gates", po::value(&gates), "gates to run, comma-separated (default: smoke,json,tools,responses,needle,images)")
      ("json-requests", po::value(&o.gate.json_requests)->default_value(20), "strict-JSON requests")
      ("tool-requests", po::value(&o.gate.tool_requests)->default_value(20),
       "tool-call requests, in turn single, parallel, streaming, tool-result continuation, long-context")
      ("tool-depth", po::value(&o.gate.tool_depth), "prompt tokens of the long-context tool call (default: half the context)")
      ("depths", po::value(&needle_depths), "needle depths in tokens, K = 1024 (default: 1/4, 1/2 and 9/10 of the context)")
      ("sweep-depths", po::value(&sweep_depths), "depth sweep in tokens (default: 1/8, 1/4 and 1/2 of the context)")
      ("concurrency", po::value(&concurrency)->default_value(concurrency), "concurrency sweep levels")
      ("num-prompts", po::value(&o.requests_per_level), "requests per concurrency level (default: 2 × level, at least 4)")
      ("input-len", po::value(&o.sweep_input_len)->default_value(o.sweep_input_len), "concurrency sweep prompt words")
      ("output-len", po::value(&o.sweep_output_len)->default_value(o.sweep_output_len), "sweep tokens generated per request")
      ("thinking", po::bool_switch(&o.gate.thinking), "let reasoning models think in the gates (chat_template_kwargs)")
      ("tolerance", po::value(&tolerance)->default_value(tolerance, "0.03"), "speed differences within this fraction count as equal")
      ("startup-timeout", po::value(&o.startup_timeout_s)->default_value(o.startup_timeout_s), "seconds to wait for the server")
      ("request-timeout", po::value(&o.gate.timeout_s)->default_value(o.gate.timeout_s), "seconds per gate request");
  add_common_options(desc, common);
  po::positional_options_description pos;
  pos.add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln qualify RECIPE [--against INCUMBENT] [--out PREFIX] [--gates smoke,json,...] [--depths 4K,32K]\n"
      "Exit status: 0 when the decision is promote or challenger, 3 when it is reject, 1 when the qualification could\n"
      "not run (the card and manifest are still written once a server was tried).";
  int rc = parse_or_exit(argc, argv, desc, pos, vm, usage);
  if (rc >= 0) return rc;
  if (recipe.empty()) return usage_error("missing RECIPE\n" + usage);
  if (!o.base_url.empty() && !against.empty()) return usage_error("--base-url drives one server; --against needs two started here");
  o.gates = split_names(gates);
  for (const auto& g : o.gates)
    if (std::find(gate_names().begin(), gate_names().end(), g) == gate_names().end())
      return usage_error("--gates: unknown gate `" + g + "` (smoke, json, tools, responses, needle, images)");
  try {
    o.gate.needle_depths = parse_int_list(needle_depths);
    o.sweep_depths = parse_int_list(sweep_depths);
    o.concurrency = parse_int_list(concurrency);
  } catch (...) {
    return usage_error("--depths, --sweep-depths and --concurrency take comma-separated integers (K = 1024)");
  }
  for (int64_t v : o.gate.needle_depths) if (v <= 0) return usage_error("--depths must be positive");
  for (int64_t v : o.concurrency) if (v <= 0) return usage_error("--concurrency levels must be positive");
  if (o.gate.json_requests < 1 || o.gate.tool_requests < 1) return usage_error("--json-requests and --tool-requests must be positive");
  if (!setup_logging(common)) return 2;
  if (common.log_level.empty()) spdlog::set_level(spdlog::level::warn);
  load_plugins(common);
  o.plugin_dirs = common.plugin_dirs;
  // Both recipes are checked before either server starts: an incumbent that cannot load should not cost a candidate run.
  for (const std::string& f : {recipe, against}) {
    if (f.empty()) continue;
    if (!std::filesystem::exists(f)) return fail("recipe " + f + " does not exist");
    if (auto r = load_recipe(f, o.sets, global_registry()); !r.ok()) return fail(r.status().message());
  }

  std::string command = "kiln";
  for (int i = 0; i < argc; ++i) command += " " + std::string(argv[i]);
  QualifyReport report;
  report.command = command;
  report.date = utc_now();
  report.gpu = gpu_info();
  report.plugins = loaded_plugins();
  report.capabilities = capabilities();

  // A server that dies mid-request must fail the gate, not end this process on a write to its closed socket.
  std::signal(SIGPIPE, SIG_IGN);
  QualifyRun cand = run_qualification("candidate", recipe, o, out_prefix, "");
  if (cand.files.empty()) return fail(cand.error);  // no server was tried (--base-url answered nothing): no card
  QualifyRun inc;
  if (!against.empty()) {
    inc = run_qualification("incumbent", against, o, out_prefix, ".incumbent");
    if (inc.files.empty()) return fail("incumbent: " + inc.error);
  }
  report.candidate = &cand;
  report.incumbent = against.empty() ? nullptr : &inc;
  report.decision = decide(cand, report.incumbent, tolerance);

  const std::string card_path = out_prefix + ".md", manifest_path = out_prefix + ".json";
  const std::string card = result_card(report);
  if (!(std::ofstream(card_path) << card)) return fail("cannot write " + card_path);
  std::vector<std::string> artifacts = {card_path};
  artifacts.insert(artifacts.end(), cand.files.begin(), cand.files.end());
  artifacts.insert(artifacts.end(), inc.files.begin(), inc.files.end());
  // Replace, not throw: a server's text can hold bytes that are not UTF-8, and the manifest must still be written.
  const std::string manifest = json_text(evidence_manifest(report, artifacts), 2);
  if (!(std::ofstream(manifest_path) << manifest << "\n"))
    return fail("cannot write " + manifest_path);
  std::cout << card;
  std::cerr << "wrote " << card_path << " and " << manifest_path << "\n";
  if (!cand.error.empty()) return fail(cand.error);
  if (!inc.error.empty()) return fail("incumbent: " + inc.error);
  return report.decision.verdict == "reject" ? 3 : 0;
}

}  // namespace kiln::cli
