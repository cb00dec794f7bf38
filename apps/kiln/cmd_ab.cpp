// `kiln ab`: A/B two recipes, or one recipe with two sets of --set overrides, on the same prompts and
// lengths, matched and interleaved (A B A B …) so drift on the machine hits both arms alike. Reports decode
// tok/s, TTFT, acceptance length and per-position acceptance per arm, and B/A with its spread over
// repetitions; writes a markdown result card and JSON. Before loading, each arm's recipe goes through the memory
// model (memory_screen_gate.h); the card puts its predicted interval beside what each arm measured once started.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <fstream>
#include <iostream>

#include <spdlog/spdlog.h>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "build_info.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "json_text.h"
#include "memory_screen_gate.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Arm {
  std::string label, recipe_file;
  std::vector<std::string> sets;
  Recipe recipe;
  std::string recipe_hash;
  std::optional<MemoryModel> screen;  // the memory model before load; none where it could not be computed
  MeasuredMemory measured;            // once its engine started: what loading this arm added
  LoadedModel model;
  StartedEngine engine;
  std::vector<double> decode_tps, ttft, output_tps;  // one entry per repetition
  EngineMetrics before, after;
};

// FNV-1a 64 of the resolved recipe: identifies exactly what ran (file + overrides + defaults).
std::string fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

struct Run {
  double ttft = 0, decode_tps = 0;
  int64_t tokens = 0;
};

// Submits every prompt (at most `concurrency` in flight) and waits; returns per-request timings and the wall time.
Result<std::vector<Run>> run_prompts(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                     int64_t concurrency, double& wall) {
  std::vector<Run> runs(prompts.size());
  std::mutex m;
  std::condition_variable cv;
  int64_t in_flight = 0;
  size_t done = 0;
  std::string error;
  auto t0 = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return in_flight < concurrency; });
      ++in_flight;
    }
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    auto start = Clock::now();
    auto first = std::make_shared<Clock::time_point>();
    auto r = engine.submit(p, [&, i, start, first](const TokenEvent& e) {
      auto now = Clock::now();
      std::lock_guard<std::mutex> lock(m);
      if (e.token >= 0) {
        if (runs[i].tokens == 0) {
          *first = now;
          runs[i].ttft = std::chrono::duration<double>(now - start).count();
        }
        ++runs[i].tokens;
      }
      if (e.finished) {
        if (e.finish_reason == FinishReason::kError && error.empty()) error = e.error;
        const double decode = std::chrono::duration<double>(now - *first).count();
        runs[i].decode_tps = runs[i].tokens > 1 && decode > 0 ? (runs[i].tokens - 1) / decode : 0;
        --in_flight;
        ++done;
        cv.notify_all();
      }
      return true;
    });
    if (!r.ok()) return r.status();
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done == prompts.size(); });
  wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!error.empty()) return internal_error(error);
  return runs;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
double stddev(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0;
}

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string gib_range(const MemoryRange& r) {
  return fmt("%.3f", static_cast<double>(r.low) / (1 << 30)) + " .. " + fmt("%.3f", static_cast<double>(r.high) / (1 << 30));
}

// The card's memory table: each arm's predicted interval (the memory model before load) beside what it measured
// once its engine started; and the same under each arm's "memory" in the JSON.
std::string memory_section(const Arm (&arms)[2], nlohmann::json& j) {
  std::ostringstream md;
  md << "\n| arm | memory | predicted at load GiB | predicted peak GiB | measured after start GiB | screen |\n"
     << "|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < 2; ++i) {
    const Arm& arm = arms[i];
    if (!arm.screen) {
      md << "| " << arm.label << " | — | not computed | — | — | — |\n";
      continue;
    }
    const MemoryModel& m = *arm.screen;
    const bool device = m.inputs.cuda;
    const MemoryWhere where = device ? MemoryWhere::kDevice : MemoryWhere::kHost;
    const MemoryRange load = m.total(where, MemoryWhen::kLoad), peak = m.total(where, MemoryWhen::kRun);
    const uint64_t measured = device ? arm.measured.device_bytes : arm.measured.host_bytes;
    const bool within = measured >= load.low && measured <= load.high;
    const std::string verdict = !m.judged ? "no verdict" : m.go ? "go" : "no-go (--ignore-screen)";
    md << "| " << arm.label << " | " << (device ? "device" : "host") << " (" << m.inputs.device_name << ") | "
       << gib_range(load) << " | " << gib_range(peak) << " | "
       << fmt("%.3f", static_cast<double>(measured) / (1 << 30)) << (within ? " (within)" : " (OUTSIDE)") << " | "
       << verdict << " |\n";
    j["arms"][i]["memory"] = {{"where", device ? "device" : "host"},
                              {"device", m.inputs.device_name},
                              {"predicted_at_load_bytes", {load.low, load.high}},
                              {"predicted_peak_bytes", {peak.low, peak.high}},
                              {"measured_after_start_bytes", measured},
                              {"within", within},
                              {"screen", verdict}};
  }
  md << "\nMemory: the memory model's interval before load (as `kiln recipe show` prints it) beside what each arm's "
        "load added once its engine started (the checkpoint's mapping and the memory grown, or the device memory in "
        "use); B loads beside A, so its figure leaves out what A already made (on CUDA, the context).\n";
  return md.str();
}

}  // namespace

int cmd_ab(int argc, char** argv) {
  CommonOptions common;
  std::string recipe_a, recipe_b, out_prefix = "ab-result", prompts_file;
  std::vector<std::string> sets_a, sets_b, sets;
  int64_t reps = 5, max_tokens = 128, num_prompts = 8, concurrency = 1;
  bool ignore_screen = false;
  po::options_description desc("kiln ab options");
  desc.add_options()
      ("help,h", "show this help")
      ("recipe", po::value(&recipe_a), "recipe of arm A (and of B unless --recipe-b)")
      ("recipe-b", po::value(&recipe_b), "recipe of arm B")
      ("a", po::value(&sets_a)->composing(), "override for arm A: section.key=value (repeatable)")
      ("b", po::value(&sets_b)->composing(), "override for arm B: section.key=value (repeatable)")
      ("set", po::value(&sets)->composing(), "override for both arms")
      ("prompts", po::value(&prompts_file), "text file, one prompt per line (default: built-in prompts)")
      ("num-prompts", po::value(&num_prompts)->default_value(num_prompts), "prompts per repetition")
      ("max-tokens", po::value(&max_tokens)->default_value(max_tokens), "tokens generated per prompt")
      ("concurrency", po::value(&concurrency)->default_value(concurrency), "requests in flight (1 = c1 latency)")
      ("reps", po::value(&reps)->default_value(reps), "repetitions, each running A then B")
      ("out", po::value(&out_prefix)->default_value(out_prefix), "writes <out>.md and <out>.json")
      ("ignore-screen", po::bool_switch(&ignore_screen), kIgnoreScreenHelp);
  add_common_options(desc, common);
  po::positional_options_description pos;
  pos.add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln ab RECIPE --a section.key=value --b section.key=value [options]\n"
      "       kiln ab RECIPE_A --recipe-b RECIPE_B [options]";
  int rc = parse_or_exit(argc, argv, desc, pos, vm, usage);
  if (rc >= 0) return rc;
  if (recipe_a.empty()) return fail("missing RECIPE\n" + usage);
  if (recipe_b.empty() && sets_a.empty() && sets_b.empty()) return fail("nothing differs between A and B\n" + usage);
  if (reps < 1 || max_tokens < 1 || num_prompts < 1 || concurrency < 1) return fail("--reps, --max-tokens, --num-prompts and --concurrency must be positive");
  if (!setup_logging(common)) return 2;
  if (common.log_level.empty()) spdlog::set_level(spdlog::level::warn);
  load_plugins(common);

  Arm arms[2];
  arms[0].label = "A";
  arms[1].label = "B";
  arms[0].recipe_file = recipe_a;
  arms[1].recipe_file = recipe_b.empty() ? recipe_a : recipe_b;
  arms[0].sets = sets;
  arms[0].sets.insert(arms[0].sets.end(), sets_a.begin(), sets_a.end());
  arms[1].sets = sets;
  arms[1].sets.insert(arms[1].sets.end(), sets_b.begin(), sets_b.end());
  // Both recipes screened before either is loaded: a B that cannot fit is refused before A's weights are read.
  std::string refusals;
  for (Arm& arm : arms) {
    auto r = load_recipe(arm.recipe_file, arm.sets, global_registry());
    if (!r.ok()) return fail("arm " + arm.label + ": " + r.status().message());
    arm.recipe = std::move(r).value();
    arm.recipe_hash = fnv1a(arm.recipe.to_toml());
    std::string what = "arm " + arm.label + " (" + arm.recipe_file;
    for (const std::string& set : arm.sets) what += " --set " + set;
    ScreenedRecipe screened = screen_recipe(arm.recipe, what + ")", std::cout);
    arm.screen = std::move(screened.model);
    if (!screened.refusal.empty()) refusals += (refusals.empty() ? "" : "\n") + screened.refusal;
  }
  if (!refusals.empty()) {
    if (!ignore_screen) return fail(refusals + "\n(--ignore-screen loads it anyway)");
    std::fprintf(stderr, "kiln ab: --ignore-screen: loading despite\n%s\n", refusals.c_str());
  }
  for (Arm& arm : arms) {
    // Each arm is measured by what loading it adds: B loads beside A, so its baseline is taken now (on CUDA the
    // context and cuBLAS handle A made are not in B's figure).
    const bool cuda = arm.recipe.section("model").get_string("device") == "cuda";
    uint64_t device_before = 0;
    if (arm.screen) {
      arm.screen->host_baseline_bytes = process_anon_bytes();
      if (&arm != &arms[0]) device_before = measure_memory(*arm.screen, cuda, 0).device_bytes;
    }
    auto m = load_model(arm.recipe, global_registry(), model_load_options(arm.recipe));
    if (!m.ok()) return fail("arm " + arm.label + ": " + m.status().message());
    arm.model = std::move(m).value();
    auto e = start_engine(arm.model, arm.recipe, {}, arm.screen ? &*arm.screen : nullptr);
    if (!e.ok()) return fail("arm " + arm.label + ": " + e.status().message());
    arm.engine = std::move(e).value();
    if (arm.screen) {
      arm.measured = measure_memory(*arm.screen, arm.model.on_gpu(), checkpoint_bytes(arm.model));
      arm.measured.device_bytes -= std::min(arm.measured.device_bytes, device_before);
    }
  }

  // The same prompts for both arms, tokenized with arm A's tokenizer.
  std::vector<std::string> texts;
  if (!prompts_file.empty()) {
    std::ifstream in(prompts_file);
    if (!in) return fail("--prompts: cannot read " + prompts_file);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(line);
    if (texts.empty()) return fail("--prompts: " + prompts_file + " has no prompts");
  } else {
    texts = {"The socket module provides", "Return a new list", "This module implements", "Raise an exception if",
             "The default value is", "Create a new thread", "Read the file and", "If the argument is"};
  }
  auto tok = Tokenizer::load(std::filesystem::path(arms[0].recipe.section("model").get_string("path")) / "tokenizer.json");
  if (!tok.ok()) return fail(tok.status().message());
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < num_prompts; ++i) prompts.push_back(tok->encode(texts[i % texts.size()], false));

  for (Arm& arm : arms) arm.before = arm.engine.engine->metrics();
  for (int64_t r = 0; r < reps; ++r) {
    for (Arm& arm : arms) {  // interleaved: A, B, A, B, ...
      double wall = 0;
      auto runs = run_prompts(*arm.engine.engine, prompts, max_tokens, concurrency, wall);
      if (!runs.ok()) return fail("arm " + arm.label + ": " + runs.status().message());
      std::vector<double> d, t;
      int64_t tokens = 0;
      for (const Run& x : *runs) {
        d.push_back(x.decode_tps);
        t.push_back(x.ttft);
        tokens += x.tokens;
      }
      arm.decode_tps.push_back(mean(d));
      arm.ttft.push_back(mean(t));
      arm.output_tps.push_back(tokens / wall);
      std::fprintf(stderr, "rep %lld arm %s: decode %.1f tok/s per request, %.1f output tok/s\n",
                   static_cast<long long>(r + 1), arm.label.c_str(), arm.decode_tps.back(), arm.output_tps.back());
    }
  }
  for (Arm& arm : arms) arm.after = arm.engine.engine->metrics();

  // B/A per repetition (matched pairs), then its mean and spread.
  std::vector<double> ratio_decode, ratio_output;
  for (int64_t r = 0; r < reps; ++r) {
    ratio_decode.push_back(arms[1].decode_tps[r] / arms[0].decode_tps[r]);
    ratio_output.push_back(arms[1].output_tps[r] / arms[0].output_tps[r]);
  }

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "kiln ") + std::string(argv[i]);
  const std::string device = arms[0].recipe.section("model").get_string("device") == "cuda" ? "cuda" : "cpu";

  nlohmann::json j = {{"date", date}, {"command", command}, {"commit", build_commit()}, {"device", device}, {"reps", reps},
                      {"prompts", num_prompts}, {"max_tokens", max_tokens}, {"concurrency", concurrency}, {"arms", nlohmann::json::array()}};
  std::ostringstream md;
  md << "# kiln ab result\n\n" << date << " · kiln " << build_commit() << " · device: " << device << " · `" << command
     << "`\n\n"
     << num_prompts << " prompts × " << max_tokens << " tokens, concurrency " << concurrency << ", " << reps
     << " interleaved repetitions (A B A B …)\n\n"
     << "| arm | recipe | overrides | hash | decode tok/s (per request) | output tok/s | TTFT ms | acceptance | mean acc. length | per-position acceptance |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (Arm& arm : arms) {
    const int64_t drafts = arm.after.spec_drafts - arm.before.spec_drafts;
    const int64_t drafted = arm.after.spec_draft_tokens - arm.before.spec_draft_tokens;
    const int64_t accepted = arm.after.spec_accepted_tokens - arm.before.spec_accepted_tokens;
    std::string per_pos;
    nlohmann::json pos_j = nlohmann::json::array();
    for (size_t p = 0; p < arm.after.spec_drafted_per_pos.size(); ++p) {
      const double rate = arm.after.spec_drafted_per_pos[p]
                              ? double(arm.after.spec_accepted_per_pos[p]) / arm.after.spec_drafted_per_pos[p]
                              : 0;
      per_pos += (p ? " " : "") + fmt("%.2f", rate);
      pos_j.push_back(rate);
    }
    std::string overrides;
    for (const auto& s : arm.sets) overrides += (overrides.empty() ? "" : " ") + s;
    const double acc_rate = drafted ? double(accepted) / drafted : 0;
    const double acc_len = drafts ? 1.0 + double(accepted) / drafts : 1.0;
    md << "| " << arm.label << " | " << arm.recipe_file << " | " << (overrides.empty() ? "—" : overrides) << " | "
       << arm.recipe_hash << " | " << fmt("%.1f", mean(arm.decode_tps)) << " ± " << fmt("%.1f", stddev(arm.decode_tps))
       << " | " << fmt("%.1f", mean(arm.output_tps)) << " ± " << fmt("%.1f", stddev(arm.output_tps)) << " | "
       << fmt("%.1f", 1e3 * mean(arm.ttft)) << " | " << (drafts ? fmt("%.1f%%", 100 * acc_rate) : "—") << " | "
       << (drafts ? fmt("%.2f", acc_len) : "—") << " | " << (per_pos.empty() ? "—" : per_pos) << " |\n";
    j["arms"].push_back({{"label", arm.label}, {"recipe", arm.recipe_file}, {"overrides", arm.sets},
                         {"recipe_hash_fnv1a64", arm.recipe_hash}, {"decode_tok_s", arm.decode_tps},
                         {"output_tok_s", arm.output_tps}, {"ttft_s", arm.ttft}, {"acceptance_rate", acc_rate},
                         {"mean_acceptance_length", acc_len}, {"acceptance_per_position", pos_j}});
  }
  md << "\n**B/A decode tok/s: " << fmt("%.3f", mean(ratio_decode)) << " ± " << fmt("%.3f", stddev(ratio_decode))
     << "** · B/A output tok/s: " << fmt("%.3f", mean(ratio_output)) << " ± " << fmt("%.3f", stddev(ratio_output))
     << " (mean ± stddev over matched repetitions)\n";
  j["ratio_b_over_a"] = {{"decode", ratio_decode}, {"output", ratio_output}};
  md << memory_section(arms, j);
  std::ofstream(out_prefix + ".md") << md.str();
  std::ofstream(out_prefix + ".json") << json_text(j, 2) << "\n";
  std::cout << md.str();
  return 0;
}

}  // namespace kiln::cli
