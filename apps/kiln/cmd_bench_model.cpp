// `kiln bench decode` and `kiln bench prefill`: the options, the report header (date, device, model, command,
// roofline) and the output of bench_model.h's sweeps.
#include <algorithm>
#include <ctime>
#include <tuple>
#include <fstream>
#include <iostream>

#include "build_info.h"
#include "bench_drafted.h"
#include "bench_model.h"
#include "cli_common.h"
#include "commands.h"
#include "json_text.h"
#include "memory_screen_gate.h"
#include "model/model_cost.h"

namespace kiln::cli {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// The command line as typed (arguments with spaces quoted), for the report.
std::string command_line(int argc, char** argv) {
  std::string s = "kiln bench";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    s += a.find(' ') == std::string::npos ? " " + a : " '" + a + "'";
  }
  return s;
}

struct Common {
  CommonOptions common;
  std::string recipe_file, json_file;
  std::vector<std::string> sets;
  bool ignore_screen = false;
};

void add_options(po::options_description& desc, Common& c) {
  desc.add_options()
      ("help,h", "show this help")
      ("recipe,r", po::value(&c.recipe_file), "recipe (TOML) naming the model, its device and its plugins")
      ("set", po::value(&c.sets)->composing(), "override a recipe key: section.key=value (repeatable); [scheduler] "
                                               "is sized by the benchmark itself")
      ("json", po::value(&c.json_file), "also write the results as JSON to this file")
      ("ignore-screen", po::bool_switch(&c.ignore_screen), kIgnoreScreenHelp);
  add_common_options(desc, c.common);
}

// Parses a list flag; an error message, or "" with `out` filled with positive integers.
std::string parse_positive_list(const std::string& flag, const std::string& text, std::vector<int64_t>& out) {
  try {
    out = parse_int_list(text);
  } catch (const std::exception&) {
    return flag + " `" + text + "` is not a comma-separated list of integers (K = 1024)";
  }
  if (out.empty()) return flag + " is empty";
  for (int64_t v : out)
    if (v <= 0) return flag + " `" + text + "`: every value must be positive";
  return "";
}

nlohmann::json report_header(const std::string& benchmark, const BenchTarget& t, const std::string& command) {
  const ModelConfig& c = *t.config;
  nlohmann::json model = {{"config", c.source}, {"model_type", c.model_type}, {"layers", c.num_hidden_layers}};
  if (t.weight_gib > 0) model["gpu_weight_gib"] = t.weight_gib;
  return {{"benchmark", benchmark},
          {"date", utc_now()},
          {"commit", build_commit()},
          {"device", t.device},
          {"command", command},
          {"model", model},
          {"kv_pool", {{"tokens", t.capacity.tokens()}, {"block_size", t.capacity.block_size},
                       {"bytes", t.capacity.bytes}}}};
}

void print_header(const std::string& title, const BenchTarget& t, const std::string& command) {
  const ModelConfig& c = *t.config;
  std::printf("%s, %s, kiln %s, %s: %s (%lld layers, %lld experts top-%lld)", title.c_str(), utc_now().c_str(),
              build_commit(), t.device.c_str(),
              c.source.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.n_routed_experts),
              static_cast<long long>(c.num_experts_per_tok));
  if (t.weight_gib > 0) std::printf(", %.2f GiB of weights on the device", t.weight_gib);
  std::printf("\ncommand: %s\n", command.c_str());
}

int write_json(const std::string& path, const nlohmann::json& report) {
  if (path.empty()) return 0;
  std::ofstream f(path);
  f << json_text(report, 2) << "\n";
  return f ? 0 : fail("cannot write " + path);
}

}  // namespace

int bench_decode(int argc, char** argv) {
  Common c;
  DecodeBenchOptions o;
  std::string contexts = "4096,32768,131072", batches = "1,4,16,64", rows = "1", draft_profile;
  bool no_graphs = false;
  po::options_description desc("kiln bench decode options");
  add_options(desc, c);
  desc.add_options()
      ("contexts", po::value(&contexts)->default_value(contexts), "context lengths to decode at (K = 1024)")
      ("batch", po::value(&batches)->default_value(batches), "sequences decoding together, one token each per step")
      ("verify-rows", po::value(&rows)->default_value(rows),
       "query rows per sequence per step: 1 = decode, 1 + K = the verification pass of K drafts")
      ("steps", po::value(&o.steps)->default_value(o.steps), "timed steps per point")
      ("warmup", po::value(&o.warmup)->default_value(o.warmup), "untimed steps before them")
      ("bandwidth", po::value(&o.bandwidth)->default_value(o.bandwidth, "measured"),
       "memory bandwidth for the roofline, bytes/s (default: a copy on the recipe's device, read + write, measured "
       "before the points run)")
      ("no-graphs", po::bool_switch(&no_graphs), "CUDA: launch every kernel of a step instead of replaying a CUDA graph")
      ("profile", po::bool_switch(&o.profile),
       "CUDA: also print where each point's step time goes, by stage (implies --no-graphs)")
      ("draft-profile", po::value(&draft_profile),
       "p1,..,pK: also decode through the engine plainly, then drafting K tokens with an oracle that accepts draft i "
       "with probability p_i given the drafts before it were accepted (--steps tokens per sequence); report the "
       "speedup against the ideal the measured verification pass allows");
  po::positional_options_description pos;
  pos.add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln bench decode RECIPE [--contexts 4096,32768,131072] [--batch 1,4,16,64] [--steps 64] [--json FILE]\n"
      "                              [--draft-profile 0.9,0.8,0.7,0.6,0.5]\n"
      "Decode tok/s of the recipe's model at each context × batch, beside the memory roofline; with --draft-profile,\n"
      "drafting's speedup through the engine against the ideal from the verification pass's cost.";
  if (int rc = parse_or_exit(argc, argv, desc, pos, vm, usage); rc >= 0) return rc;
  if (c.recipe_file.empty()) return fail("give a recipe\n" + usage);
  for (const auto& [flag, text, list] : {std::tuple{"--contexts", &contexts, &o.contexts},
                                         std::tuple{"--batch", &batches, &o.batches},
                                         std::tuple{"--verify-rows", &rows, &o.rows}})
    if (std::string e = parse_positive_list(flag, *text, *list); !e.empty()) return fail(e);
  if (o.steps < 1) return fail("--steps must be at least 1");
  if (o.warmup < 0) return fail("--warmup must not be negative");
  if (vm.count("bandwidth") && !vm["bandwidth"].defaulted() && !(o.bandwidth > 0))
    return fail("--bandwidth must be positive");
  std::vector<double> profile;
  if (!draft_profile.empty()) {
    if (std::string e = parse_draft_profile(draft_profile, profile); !e.empty()) return fail(e);
    // Pass 2 times the decode step and the verification pass of 1 + K rows beside whatever --verify-rows asks.
    for (int64_t r : {int64_t{1}, static_cast<int64_t>(profile.size()) + 1})
      if (std::find(o.rows.begin(), o.rows.end(), r) == o.rows.end()) o.rows.push_back(r);
  }
  if (!setup_logging(c.common)) return 2;
  load_plugins(c.common);

  BenchShape shape;
  for (int64_t ctx : o.contexts) shape.positions = std::max(shape.positions, decode_positions(ctx, o));
  for (int64_t b : o.batches) shape.sequences = std::max(shape.sequences, b);
  shape.step_tokens = shape.sequences * *std::max_element(o.rows.begin(), o.rows.end());
  if (!profile.empty()) {
    const int64_t k = static_cast<int64_t>(profile.size());
    int64_t prompts = 0;
    for (int64_t ctx : o.contexts) {
      // The engine's requests: the prompt, --steps tokens, and the KV positions it reserves past a pass.
      shape.positions = std::max(shape.positions, ctx + o.steps + 2 * k + 1);
      prompts = std::max(prompts, ctx * shape.sequences);
    }
    // Prompt chunks of up to 8192 tokens a step (the prefill sweep's default): the batch gets in within a few steps.
    shape.step_tokens = std::max(shape.step_tokens, std::min<int64_t>(prompts, 8192));
  }
  auto target = open_bench_target(c.recipe_file, c.sets, shape, !no_graphs && !o.profile, c.ignore_screen,
                                  2 * static_cast<int64_t>(profile.size()));
  if (!target.ok()) return fail(target.status().message());
  const std::string command = command_line(argc, argv);
  std::string bandwidth_source = "given with --bandwidth";
  if (o.bandwidth == 0) {
    o.bandwidth = measure_copy_bandwidth(*target, bandwidth_source);
    if (!(o.bandwidth > 0)) return fail("could not measure the device's copy bandwidth (no memory for the buffers): give --bandwidth");
  }
  print_header("kiln bench decode", *target, command);
  const ModelConfig& mc = *target->config;
  std::printf("roofline = batch x %.3g B/s (%s) / (weight + KV bytes read per step). Weights: %s, router fp32; routed "
              "experts read per MoE layer at batch B: the expected distinct ones under uniform routing, "
              "E(1-(1-k/E)^B) with E = %lld, k = %lld. KV: B x mean keys attended x %.0f B a token (the pool's: %lld "
              "layers of the recipe's KV layout%s).\n\n",
              o.bandwidth, bandwidth_source.c_str(), target->pricing_basis.c_str(), static_cast<long long>(mc.n_routed_experts),
              static_cast<long long>(mc.num_experts_per_tok),
              static_cast<double>(target->capacity.bytes) / static_cast<double>(std::max<int64_t>(target->capacity.tokens(), 1)),
              static_cast<long long>(mc.num_hidden_layers), mc.index_topk > 0 ? " and the indexer's keys" : "");
  std::fflush(stdout);
  auto points = run_decode_bench(*target, o);
  if (!points.ok()) return fail(points.status().message());
  std::cout << decode_table(*points) << stage_tables(*points) << std::flush;
  nlohmann::json report = report_header("decode", *target, command);
  report.update(decode_json(*points, o));
  report["bandwidth_source"] = bandwidth_source;
  if (!profile.empty()) {
    auto drafted = run_drafted_bench(*target, o, profile, *points);
    if (!drafted.ok()) return fail(drafted.status().message());
    std::cout << drafted_table(*drafted, profile) << std::flush;
    report["drafting"] = drafted_json(*drafted, profile);
    int64_t broken = 0;
    for (const DraftedPoint& p : *drafted) broken += p.skipped.empty() && !p.lossless();
    if (broken > 0)
      std::printf("\nWARNING: %lld point(s) were NOT lossless: drafted greedy output differs from plain greedy output "
                  "(see the table's last column); that is a bug to report\n",
                  static_cast<long long>(broken));
  }
  return write_json(c.json_file, report);
}

int bench_prefill(int argc, char** argv) {
  Common c;
  PrefillBenchOptions o;
  std::string lengths = "4096,32768,131072";
  po::options_description desc("kiln bench prefill options");
  add_options(desc, c);
  desc.add_options()
      ("lengths", po::value(&lengths)->default_value(lengths), "prompt lengths (K = 1024)")
      ("chunk", po::value(&o.chunk)->default_value(o.chunk), "tokens per forward (a long prompt in chunks, as the scheduler runs it)")
      ("peak-tflops", po::value(&o.peak_tflops)->default_value(o.peak_tflops), "dense bf16 TFLOP/s the device reaches, for % of peak")
      ("profile", po::bool_switch(&o.profile),
       "after each timed prompt run it again with CUDA events between the model's stages and print where its time "
       "goes (untimed; the event waits add a little)");
  po::positional_options_description pos;
  pos.add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln bench prefill RECIPE [--lengths 4096,32768,131072] [--chunk 8192] [--peak-tflops 790] [--profile] [--json FILE]\n"
      "Prefill tok/s of the recipe's model at each prompt length, and its model FLOP rate against a peak.";
  if (int rc = parse_or_exit(argc, argv, desc, pos, vm, usage); rc >= 0) return rc;
  if (c.recipe_file.empty()) return fail("give a recipe\n" + usage);
  if (std::string e = parse_positive_list("--lengths", lengths, o.lengths); !e.empty()) return fail(e);
  if (o.chunk < 1) return fail("--chunk must be at least 1");
  if (!(o.peak_tflops > 0)) return fail("--peak-tflops must be positive");
  if (!setup_logging(c.common)) return 2;
  load_plugins(c.common);

  BenchShape shape;
  for (int64_t n : o.lengths) shape.positions = std::max(shape.positions, n);
  shape.step_tokens = std::min(o.chunk, shape.positions);
  auto target = open_bench_target(c.recipe_file, c.sets, shape, /*cuda_graphs=*/true, c.ignore_screen);
  if (!target.ok()) return fail(target.status().message());
  const std::string command = command_line(argc, argv);
  print_header("kiln bench prefill", *target, command);
  std::printf("model FLOPs = 2 x %.4g active params x tokens + 2 x hidden x vocab per chunk (its logits row) + causal "
              "attention 2 x layers x heads x (qk + v head dims) x tokens(tokens+1)/2; %% of a %.0f TFLOP/s peak\n\n",
              active_params_per_token(*target->config), o.peak_tflops);
  std::fflush(stdout);
  auto points = run_prefill_bench(*target, o);
  if (!points.ok()) return fail(points.status().message());
  std::cout << prefill_table(*points, o) << stage_tables(*points) << std::flush;
  nlohmann::json report = report_header("prefill", *target, command);
  report.update(prefill_json(*points, o));
  return write_json(c.json_file, report);
}

}  // namespace kiln::cli
