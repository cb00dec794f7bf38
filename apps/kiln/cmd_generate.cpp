// `kiln generate`: load a recipe's model and stream a completion to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "json_text.h"
#include "rank_launcher.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "engine/single_request.h"
#include "kiln/log.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_chat_template.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

// Token ids the model stops at: the config's eos ids plus the GLM chat turn ends when the vocabulary has them.
std::vector<int32_t> stop_tokens(const Architecture& arch, const Tokenizer& tok) {
  std::vector<int32_t> stops;
  for (int64_t id : arch.eos_token_ids()) stops.push_back(static_cast<int32_t>(id));
  for (const char* t : {"<|endoftext|>", "<|user|>", "<|observation|>"})
    if (auto id = tok.token_to_id(t)) stops.push_back(*id);
  return stops;
}

// One user message through the checkpoint's own chat template (as `kiln serve` renders it), or GLM-4.7's built-in
// one when the checkpoint has none; `thinking` is the templates' enable_thinking.
Result<std::string> render_chat(const std::filesystem::path& dir, const std::string& message, bool thinking) {
  KILN_ASSIGN_OR_RETURN(auto checkpoint_template, JinjaChatTemplate::from_checkpoint(dir));
  if (checkpoint_template) {
    ChatRenderInput input;
    input.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", message}}});
    input.kwargs = {{"enable_thinking", thinking}};
    return checkpoint_template->render(input);
  }
  log::info("{} has no chat template (tokenizer_config.json, chat_template.jinja): using GLM-4.7's", dir.string());
  ChatMessage user;
  user.role = "user";
  user.content = message;
  ChatTemplateOptions opts;
  opts.enable_thinking = thinking;
  return render_glm_chat({user}, opts);
}

// "3, 17,42" → {3, 17, 42}.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    char* end = nullptr;
    const std::string digits = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    const long long v = std::strtoll(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      return invalid_argument("--prompt-ids `" + text + "`: `" + item + "` is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return invalid_argument("--prompt-ids `" + text + "` names no token");
  return ids;
}

// The speeds line on stderr: prefill is submit → first token, decode the steps after it.
void print_stats(const SingleRequestStats& stats, const std::string& acceptance) {
  const double prefill_tps = stats.prompt_tokens / std::max(stats.prefill_seconds, 1e-9);
  const int64_t decode_steps = std::max<int64_t>(stats.generated_tokens - 1, 0);
  const double decode_tps = decode_steps / std::max(stats.decode_seconds, 1e-9);
  std::fprintf(stderr, "prefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s%s%s\n",
               static_cast<long long>(stats.prompt_tokens), prefill_tps, static_cast<long long>(stats.generated_tokens),
               decode_tps, acceptance.c_str(), stats.stopped_by_token ? " (stopped at end of turn)" : "");
}

// Ids in, ids out: for checkpoints without a tokenizer (the test fixtures) and for comparing runs token by token.
int generate_ids(LoadedModel& loaded, const Recipe& recipe, const MemoryModel* screen, std::vector<int32_t> ids,
                 int64_t max_tokens, SamplingOptions sampling, bool show_stats) {
  auto started = start_engine(loaded, recipe, {}, screen);
  if (!started.ok()) return fail(started.status().message());
  RequestParams request;
  request.prompt = std::move(ids);
  request.max_tokens = max_tokens;
  request.sampling = sampling;
  SingleRequestStats stats;
  bool first = true;
  auto print = [&](int32_t id) {
    std::cout << (first ? "" : " ") << id << std::flush;
    first = false;
    return true;
  };
  auto result = run_single_request(*started->engine, std::move(request), print, &stats);
  std::cout << std::endl;
  if (!result.ok()) return fail(result.status().message());
  if (show_stats) print_stats(stats, "");
  return 0;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  CommonOptions common;
  std::string recipe_file, model_dir, prompt, chat, prompt_ids;
  std::vector<std::string> sets;
  int64_t max_tokens = 64, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool thinking = false, show_stats = true, show_prompt = false;
  po::options_description desc("kiln generate options");
  desc.add_options()
      ("help,h", "show this help")
      ("recipe,r", po::value(&recipe_file), "recipe (TOML) naming the model and its plugins")
      ("model,m", po::value(&model_dir), "model directory (instead of --recipe: defaults for everything else)")
      ("set", po::value(&sets)->composing(), "override a recipe key: section.key=value (repeatable)")
      ("prompt,p", po::value(&prompt), "raw prompt text (no chat template)")
      ("chat,c", po::value(&chat), "a user message, wrapped in the model's chat template")
      ("prompt-ids", po::value(&prompt_ids),
       "the prompt as comma-separated token ids; prints the generated ids, space-separated (no tokenizer is read and "
       "no stop token ends it: --max-tokens does)")
      ("thinking", po::bool_switch(&thinking), "with --chat: let the model think first (<think>)")
      ("show-prompt", po::bool_switch(&show_prompt), "with --chat: print the rendered prompt before the answer")
      ("max-tokens,n", po::value(&max_tokens)->default_value(64), "tokens to generate at most")
      ("temperature,t", po::value(&temperature)->default_value(0.0f), "0 = greedy")
      ("top-p", po::value(&top_p)->default_value(1.0f), "nucleus sampling mass (1 = off)")
      ("top-k", po::value(&top_k)->default_value(0), "sample among the k likeliest tokens (0 = off)")
      ("seed", po::value(&seed)->default_value(0), "seed for sampling")
      ("no-stats", "do not print the prefill/decode speeds at the end");
  RankLaunchOptions launch;
  add_rank_launch_options(desc, launch);
  add_common_options(desc, common);
  po::positional_options_description pos;
  po::variables_map vm;
  const std::string usage =
      "usage: kiln generate (--recipe FILE | --model DIR) (--prompt TEXT | --chat TEXT | --prompt-ids IDS) [options]\n"
      "Streams the completion to stdout; speeds go to stderr." + std::string("\n") + kRankLaunchHelp;
  int rc = parse_or_exit(argc, argv, desc, pos, vm, usage);
  if (rc >= 0) return rc;
  show_stats = !vm.count("no-stats");
  if (recipe_file.empty() == model_dir.empty()) return fail("give exactly one of --recipe or --model\n" + usage);
  if (prompt.empty() + chat.empty() + prompt_ids.empty() != 2)
    return fail("give exactly one of --prompt, --chat or --prompt-ids\n" + usage);
  std::vector<int32_t> given_ids;
  if (!prompt_ids.empty()) {
    auto parsed = parse_token_ids(prompt_ids);
    if (!parsed.ok()) return fail(parsed.status().message());
    given_ids = std::move(parsed).value();
  }
  if (max_tokens < 1) return fail("--max-tokens must be at least 1");
  if (temperature < 0) return fail("--temperature must be ≥ 0");
  if (top_p <= 0 || top_p > 1) return fail("--top-p must be in (0, 1]");
  if (!setup_logging(common)) return 2;
  load_plugins(common);

  // --model DIR is a recipe of one key.
  if (!model_dir.empty())
    sets.insert(sets.begin(), "model.path=" + json_text(nlohmann::json(std::filesystem::absolute(model_dir).string())));
  // One request: an engine of one sequence (the same decode loop `kiln serve` runs).
  sets.push_back("scheduler.max_num_seqs=1");
  auto recipe = load_recipe(recipe_file, sets, global_registry());
  if (!recipe.ok()) return fail(recipe.status().message());
  const auto screen = log_memory_screen(*recipe, global_registry());  // before anything is loaded
  // Ranks as processes: start this machine's other ranks (they re-run this command as ranks 1..), before loading.
  // argv is the subcommand's; argv[-1] is the program's own name, which the ranks re-run.
  auto local_ranks = launch_local_ranks(*recipe, launch, argc + 1, argv - 1);
  if (!local_ranks.ok()) return fail(local_ranks.status().message());
  auto loaded = load_model(*recipe, global_registry(), model_load_options(*recipe));
  local_ranks->started();  // every rank met (or this one failed on its own): a rank exiting now ends no launch
  if (!loaded.ok()) return fail(loaded.status().message());
  if (loaded->is_follower()) return run_follower_rank(*loaded);
  if (!given_ids.empty()) return generate_ids(*loaded, *recipe, screen ? &*screen : nullptr, given_ids, max_tokens,
                                              {temperature, top_k, top_p, seed}, show_stats);
  const std::filesystem::path dir = recipe->section("model").get_string("path");
  auto tok = Tokenizer::load(dir / "tokenizer.json");
  if (!tok.ok()) return fail(tok.status().message());

  std::string text = prompt;
  if (!chat.empty()) {
    auto rendered = render_chat(dir, chat, thinking);
    if (!rendered.ok()) return fail(rendered.status().message());
    text = *rendered;
    if (show_prompt) std::cout << text << std::flush;
  }
  std::vector<int32_t> ids = tok->encode(text, /*parse_special=*/!chat.empty());
  if (ids.empty()) return fail("the prompt encodes to no tokens");

  auto started = start_engine(*loaded, *recipe, {}, screen ? &*screen : nullptr);
  if (!started.ok()) return fail(started.status().message());
  RequestParams request;
  request.prompt = ids;
  request.max_tokens = max_tokens;
  request.sampling = {temperature, top_k, top_p, seed};
  request.stop_token_ids = stop_tokens(*loaded->arch, *tok);

  StreamingDecoder decoder(*tok);
  SingleRequestStats stats;
  if (prompt.size()) std::cout << prompt << std::flush;
  auto print = [&](int32_t id) {
    if (tok->is_special(id)) return true;  // turn markers and stop tokens are not text
    std::cout << decoder.feed(id) << std::flush;
    return true;
  };
  auto result = run_single_request(*started->engine, std::move(request), print, &stats);
  std::string acceptance;
  const EngineMetrics metrics = started->engine->metrics();
  if (metrics.spec_drafts > 0) {
    char buf[160];
    const double rate = metrics.spec_draft_tokens ? 100.0 * metrics.spec_accepted_tokens / metrics.spec_draft_tokens : 0;
    std::snprintf(buf, sizeof buf, " | %s depth %lld: acceptance %.1f%%, mean acceptance length %.2f",
                  recipe->section("speculative").get_string("method").c_str(),
                  static_cast<long long>(recipe->section("speculative").get_int("depth", 0)), rate,
                  1.0 + static_cast<double>(metrics.spec_accepted_tokens) / metrics.spec_drafts);
    acceptance = buf;
  }
  std::cout << decoder.flush() << std::endl;
  if (!result.ok()) return fail(result.status().message());
  if (show_stats) print_stats(stats, acceptance);
  return 0;
}

}  // namespace kiln::cli
