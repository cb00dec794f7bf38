// `kiln serve RECIPE`: load the recipe's model, start the engine and the OpenAI-compatible server; SIGTERM or
// SIGINT drains the requests in flight (for at most server.drain_timeout_s), then exits. A second signal exits at
// once, without waiting for them.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iostream>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "rank_launcher.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "kiln/log.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"
#include "server/server.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

// The handler only records the signal; the main thread waits for it with sigwait, so no work runs in
// signal context.
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CommonOptions common;
  std::string recipe_file, host;
  int port = 0;
  std::vector<std::string> sets;
  po::options_description desc("kiln serve options");
  desc.add_options()
      ("help,h", "show this help")
      ("recipe", po::value(&recipe_file), "recipe (TOML)")
      ("host", po::value(&host), "listen address (overrides server.host)")
      ("port", po::value(&port), "listen port (overrides server.port; 0 = any free port)")
      ("set", po::value(&sets)->composing(), "override a recipe key: section.key=value (repeatable)");
  RankLaunchOptions launch;
  add_rank_launch_options(desc, launch);
  add_common_options(desc, common);
  po::positional_options_description pos;
  pos.add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln serve RECIPE [--host H] [--port P] [--set section.key=value]...\n"
      "Serves the OpenAI API: /v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /health, /metrics." + std::string("\n") + kRankLaunchHelp;
  int rc = parse_or_exit(argc, argv, desc, pos, vm, usage);
  if (rc >= 0) return rc;
  if (recipe_file.empty()) return fail("missing RECIPE\n" + usage);
  if (!host.empty()) sets.push_back("server.host=" + host);
  if (vm.count("port")) sets.push_back("server.port=" + std::to_string(port));
  if (!setup_logging(common)) return 2;
  load_plugins(common);

  // Block the shutdown signals before any thread starts, so every thread inherits the mask and only
  // sigwait below receives them.
  sigset_t signals = shutdown_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto recipe = load_recipe(recipe_file, sets, global_registry());
  if (!recipe.ok()) return fail(recipe.status().message());
  const auto screen = log_memory_screen(*recipe, global_registry());  // before anything is loaded
  // Ranks as processes: start this machine's other ranks (they re-run this command as ranks 1..), before loading.
  // argv is the subcommand's; argv[-1] is the program's own name, which the ranks re-run.
  auto local_ranks = launch_local_ranks(*recipe, launch, argc + 1, argv - 1);
  if (!local_ranks.ok()) return fail(local_ranks.status().message());
  auto model = load_model(*recipe, global_registry(), model_load_options(*recipe));
  local_ranks->started();  // every rank met (or this one failed on its own): a rank exiting now ends no launch
  if (!model.ok()) return fail(model.status().message());
  if (model->is_follower()) return run_follower_rank(*model);
  const std::filesystem::path dir = recipe->section("model").get_string("path");
  auto tokenizer = Tokenizer::load(dir / "tokenizer.json");
  if (!tokenizer.ok()) return fail(tokenizer.status().message());
  auto chat_template = JinjaChatTemplate::from_checkpoint(dir);
  if (!chat_template.ok()) return fail(chat_template.status().message());
  auto started = start_engine(*model, *recipe, {}, screen ? &*screen : nullptr);
  if (!started.ok()) return fail(started.status().message());

  const RecipeSection& srv = recipe->section("server");
  const RecipeSection& sched = recipe->section("scheduler");
  HttpServerOptions opts;
  opts.host = srv.get_string("host");
  opts.port = static_cast<int>(srv.get_int("port"));
  opts.model_id = dir.string();
  opts.served_name = recipe->section("model").get_string("served_name");
  if (opts.served_name.empty()) opts.served_name = dir.filename().string();
  opts.max_model_len = started->capacity.max_model_len;
  opts.max_output_tokens = sched.get_int("max_output_tokens");
  // "auto" (the default) picks what the checkpoint's family writes: DeepSeek-V3 its own call markup and no reasoning.
  opts.tool_parser = resolve_tool_parser(srv.get_string("tool_parser"), model->info.model_type);
  opts.reasoning_parser = resolve_reasoning_parser(srv.get_string("reasoning_parser"), model->info.model_type);
  log::info("server: tool_parser {}, reasoning_parser {} (model_type {})",
                opts.tool_parser.empty() ? "none" : opts.tool_parser,
                opts.reasoning_parser.empty() ? "none" : opts.reasoning_parser, model->info.model_type);
  opts.max_body_bytes = srv.get_int("max_body_bytes");
  opts.max_connections = static_cast<int>(srv.get_int("max_connections"));
  opts.header_timeout = std::chrono::seconds(srv.get_int("header_timeout_s"));
  opts.read_timeout = std::chrono::seconds(srv.get_int("read_timeout_s"));
  opts.keep_alive_interval =
      std::chrono::milliseconds(static_cast<int64_t>(std::llround(srv.get_float("keep_alive_interval_s") * 1000.0)));
  opts.drain_timeout = std::chrono::seconds(srv.get_int("drain_timeout_s"));
  const RecipeSection& media = recipe->section("media");
  opts.media.modality = started->modality;
  opts.media.modality_name = media.get_string("modality", "text");
  opts.media.max_images = media.get_int("max_images", 16);
  opts.media.remote.enabled = media.get_bool("remote_urls", false);
  opts.media.remote.max_bytes = media.get_int("remote_max_mib", 20) << 20;
  opts.media.remote.timeout_ms = media.get_int("remote_timeout_s", 10) * 1000;
  opts.media.stream = model->device->stream();
  opts.media.hidden_size = model->info.hidden_size;
  const std::string key_env = srv.get_string("api_key_env");
  if (!key_env.empty()) {
    const char* key = std::getenv(key_env.c_str());
    if (!key || !*key)
      return fail("`server.api_key_env` (" + srv.origin("api_key_env") + ") names $" + key_env + ", which is not set");
    opts.api_key = key;
  }
  if (chat_template->has_value()) {
    opts.chat_template = std::make_shared<const JinjaChatTemplate>(std::move(**chat_template));
  } else {
    log::info("{} has no chat template (tokenizer_config.json, chat_template.jinja): using GLM-4.7's", dir.string());
  }
  HttpServer server(*started->engine, *tokenizer, opts);
  Status s = server.start();
  if (!s.ok()) return fail(s.message());
  log::info("serving `{}` on http://{}:{}/v1", opts.served_name, opts.host, server.port());
  std::cout << "listening on http://" << opts.host << ":" << server.port() << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  log::info("{} received: draining requests in flight (at most {} s; a second signal exits at once)", strsignal(sig),
            opts.drain_timeout.count() / 1000);
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    server.stop();
    stopped = true;
  });
  // Waits for the drain, or for a second signal (an operator who will not wait).
  const timespec poll_interval{0, 100'000'000};
  while (!stopped) {
    siginfo_t info;
    if (sigtimedwait(&signals, &info, &poll_interval) > 0) {
      log::warn("second {} received: exiting without draining", strsignal(info.si_signo));
      std::_Exit(128 + info.si_signo);
    }
  }
  stopper.join();
  log::info("drained; exiting");
  return 0;
}

}  // namespace kiln::cli
