#include "qualify_run.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "plugin/registry.h"
#include "qualify_evidence.h"
#include "qualify_server.h"
#include "recipe/recipe.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

// The KV capacity of a server this run did not start (whose log it cannot read), from what its /metrics exports.
// Loading the recipe's model here to plan it, as `kiln recipe show` does, could take the memory the server holds.
std::string capacity_from_metrics(const ServerAddress& server, int64_t max_model_len) {
  std::istringstream in(get_text(server, "/metrics", 30));
  std::string tokens, windows;
  for (std::string line; std::getline(in, line);) {
    auto value = [&](const std::string& name) {
      return line.rfind(name, 0) == 0 && line.size() > name.size() &&
                     (line[name.size()] == '{' || line[name.size()] == ' ')
                 ? line.substr(line.rfind(' ') + 1)
                 : std::string();
    };
    if (std::string v = value("kiln:kv_cache_capacity_tokens"); !v.empty()) tokens = v;
    if (std::string v = value("kiln:kv_cache_capacity_windows"); !v.empty()) windows = v;
  }
  if (tokens.empty()) return "";
  return "KV cache: " + tokens + " tokens = " + (windows.empty() ? "?" : windows) + " windows of " +
         std::to_string(max_model_len) + " (from the server's /metrics)";
}

using GateFn = GateResult (*)(GateClient&);
struct GateEntry {
  const char* name;  // as --gates names it
  GateFn run;
};
const GateEntry kGates[] = {{"smoke", gate_smoke},         {"json", gate_strict_json}, {"tools", gate_tools},
                            {"responses", gate_responses}, {"needle", gate_needle},    {"images", gate_images}};
// As the card names it.
const char* gate_title(const std::string& name) {
  if (name == "json") return "strict JSON";
  if (name == "responses") return "Responses API";
  return nullptr;
}

// Every gate, not run because of `run.error`: the card lists them rather than an empty table.
QualifyRun& abandoned(QualifyRun& run) {
  for (const auto& entry : kGates) {
    GateResult g;
    g.name = gate_title(entry.name) ? gate_title(entry.name) : entry.name;
    g.outcome = GateResult::Outcome::kSkipped;
    g.not_run = true;
    g.reason = "not run: no server to run it against";
    run.gates.push_back(std::move(g));
  }
  return run;
}

}  // namespace

const std::vector<std::string>& gate_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& g : kGates) v.push_back(g.name);
    return v;
  }();
  return names;
}

QualifyRun run_qualification(const std::string& label, const std::string& recipe_file, const QualifyOptions& o,
                             const std::string& prefix, const std::string& suffix) {
  QualifyRun run;
  run.label = label;
  run.recipe_file = recipe_file;
  auto recipe = load_recipe(recipe_file, o.sets, global_registry());
  if (!recipe.ok()) {
    run.error = recipe.status().message();
    return run;
  }
  json files = json::array();
  for (const auto& src : recipe->sources) files.push_back({{"path", src.string()}, {"sha256", sha256_file(src)}});
  run.recipe = {{"file", recipe_file},
                {"sha256", sha256_file(recipe_file)},
                {"overrides", o.sets},
                {"sources", files},
                {"resolved_sha256", sha256_text(recipe->to_toml())}};
  const RecipeSection& model = recipe->section("model");
  run.checkpoint = checkpoint_revision(model.get_string("path"), model.get_string("revision"));
  GateSettings settings = o.gate;
  const std::string modality = recipe->section("media").get_string("modality", "text");
  settings.images = modality != "text";
  settings.image_skip_reason = "recipe has no image modality (media.modality = " + modality + ")";

  // The server: started here (its log an artifact), or the running one --base-url names.
  std::unique_ptr<ChildServer> child;
  ServerAddress server;
  if (o.base_url.empty()) {
    child = std::make_unique<ChildServer>();
    std::vector<std::string> args;
    for (const auto& s : o.sets) args.insert(args.end(), {"--set", s});
    for (const auto& d : o.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
    const std::string log = prefix + suffix + ".server.log";
    run.files.push_back(log);
    std::fprintf(stderr, "qualify %s: starting kiln serve %s (log: %s)\n", label.c_str(), recipe_file.c_str(),
                 log.c_str());
    if (std::string e = child->start(recipe_file, o.port, args, log, o.startup_timeout_s); !e.empty()) {
      run.error = e;
      run.server_exit = child->exit_text();
      return abandoned(run);
    }
    server = child->address();
    run.server =
        "`kiln serve " + recipe_file + "` started here on port " + std::to_string(server.port) + " (log: " + log + ")";
  } else if (!parse_base_url(o.base_url, server)) {
    run.error = "--base-url `" + o.base_url + "` is not http://host:port";
    return run;  // nothing was tried
  }
  if (!o.base_url.empty())
    run.server = o.base_url + ", running: not started by kiln qualify, so not known to be serving exactly this recipe";
  // The key the server demands is the one its recipe names, unless --api-key-env says otherwise.
  const std::string key_env =
      o.api_key_env.empty() ? recipe->section("server").get_string("api_key_env") : o.api_key_env;
  if (!key_env.empty())
    if (const char* k = std::getenv(key_env.c_str())) server.api_key = k;

  JsonReply models = get_json(server, "/v1/models", 30);
  if (models.status != 200 || !models.body.is_object() || !models.body.contains("data") ||
      !models.body["data"].is_array() || models.body["data"].empty() || !models.body["data"][0].is_object()) {
    run.error =
        "GET http://" + server.host + ":" + std::to_string(server.port) + "/v1/models: " + reply_failure(models);
    if (child) run.server_exit = child->stop();
    return abandoned(run);
  }
  const nlohmann::json& listed = models.body["data"][0];  // the server's reply: typed reads only
  run.model = listed.contains("id") && listed["id"].is_string() ? listed["id"].get<std::string>() : "";
  run.max_model_len = listed.contains("max_model_len") && listed["max_model_len"].is_number_integer()
                          ? listed["max_model_len"].get<int64_t>()
                          : 0;
  if (run.max_model_len <= 0) run.max_model_len = recipe->section("scheduler").get_int("max_model_len");
  run.capacity = child ? child->log_line("KV cache: ") : capacity_from_metrics(server, run.max_model_len);
  if (run.capacity.empty()) run.capacity = "not reported";

  // Depths the context can hold with room for the answer: a quarter, half and most of it.
  const int64_t room = std::max<int64_t>(64, run.max_model_len - 256);
  if (settings.needle_depths.empty()) settings.needle_depths = {room / 4, room / 2, room * 9 / 10};
  if (settings.tool_depth <= 0) settings.tool_depth = room / 2;
  std::vector<int64_t> sweep_depths = o.sweep_depths;
  if (sweep_depths.empty()) sweep_depths = {room / 8, room / 4, room / 2};

  const std::string transcript_path = prefix + suffix + ".transcript.jsonl";
  run.files.push_back(transcript_path);
  std::ofstream transcript(transcript_path);
  GateClient client(server, run.model, settings, transcript);
  auto server_gone = [&]() { return child && !child->alive(); };
  auto died = [&](const std::string& during) {
    return "the server " + child->exit_text() + " during " + during + "; its log ends:\n" + child->log_tail(10);
  };
  for (const auto& entry : kGates) {
    GateResult g;
    const bool selected = o.gates.empty() || std::find(o.gates.begin(), o.gates.end(), entry.name) != o.gates.end();
    if (!run.error.empty() || !selected) {
      g.outcome = GateResult::Outcome::kSkipped;
      g.not_run = true;
      g.reason = run.error.empty() ? "not selected (--gates)" : "not run: the server is gone";
    } else {
      std::fprintf(stderr, "qualify %s: gate %s\n", label.c_str(), entry.name);
      try {
        g = entry.run(client);
      } catch (const std::exception& e) {
        // A malformed answer (a field of the wrong type) fails the gate; it does not end the qualification.
        g.outcome = GateResult::Outcome::kFail;
        g.reason = std::string("malformed answer: ") + e.what();
      }
      if (server_gone()) {
        run.error = died(std::string("the ") + entry.name + " gate");
        g.outcome = GateResult::Outcome::kFail;
        g.reason = run.error;
      }
    }
    g.name = gate_title(entry.name) ? gate_title(entry.name) : entry.name;
    run.gates.push_back(std::move(g));
  }

  if (run.error.empty()) {
    std::fprintf(stderr, "qualify %s: depth sweep\n", label.c_str());
    std::mt19937_64 rng(1);
    std::string error;
    const double tokens_per_word = probe_tokens_per_word(server, run.model, rng, error);
    for (int64_t d : sweep_depths) {
      if (tokens_per_word <= 0) break;
      if (d + o.sweep_output_len > run.max_model_len) continue;
      run.depths.push_back(measure_depth(server, run.model, d, o.sweep_output_len, tokens_per_word, rng));
    }
    std::fprintf(stderr, "qualify %s: concurrency sweep\n", label.c_str());
    for (int64_t c : o.concurrency) {
      if (server_gone()) break;
      const int64_t n = o.requests_per_level > 0 ? o.requests_per_level : std::max<int64_t>(4, 2 * c);
      run.levels.push_back(run_level(server, run.model, c, n, o.sweep_input_len, o.sweep_output_len, false, 0));
    }
    if (server_gone()) run.error = died("the sweeps");
  }
  if (child) run.server_exit = child->stop();
  return run;
}

}  // namespace kiln::cli
