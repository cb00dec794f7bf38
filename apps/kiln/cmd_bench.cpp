// `kiln bench serve` and `kiln bench depth`: clients that measure a running `kiln serve` (or any
// OpenAI-compatible server) the way serving campaigns do (vLLM's bench serve; the seeds' depth sweep).
// `kiln bench decode|prefill` time a recipe's model in-process (cmd_bench_model.cpp).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "json_text.h"
#include "serve_client.h"
#include "serve_sweeps.h"

namespace kiln::cli {
namespace {

// Resolves --base-url, the API key and the model id (the server's first when not given); an error message or "".
std::string connect(const std::string& base_url, const std::string& api_key_env, ServerAddress& server, std::string& model) {
  if (!parse_base_url(base_url, server)) return "--base-url `" + base_url + "` is not http://host:port";
  if (!api_key_env.empty())
    if (const char* k = std::getenv(api_key_env.c_str())) server.api_key = k;
  if (model.empty()) model = first_model(server);
  if (model.empty()) return "no server answered GET /v1/models at " + base_url;
  return "";
}

int bench_serve(int argc, char** argv) {
  std::string base_url = "http://127.0.0.1:8000", model, levels = "1,2,4,8,16", out_file, api_key_env;
  int64_t requests_per_level = 0, input_len = 128, output_len = 64, images = 0, image_size = 1024;
  bool random_lengths = false;
  uint64_t seed = 0;
  po::options_description desc("kiln bench serve options");
  desc.add_options()
      ("help,h", "show this help")
      ("base-url", po::value(&base_url)->default_value(base_url), "server to drive")
      ("model", po::value(&model), "model id (default: the server's first)")
      ("concurrency", po::value(&levels)->default_value(levels), "comma-separated concurrency levels")
      ("num-prompts", po::value(&requests_per_level), "requests per level (default: 4 × concurrency, at least 8)")
      ("input-len", po::value(&input_len)->default_value(input_len), "prompt length in words (≈ tokens)")
      ("output-len", po::value(&output_len)->default_value(output_len), "tokens to generate per request")
      ("random", po::bool_switch(&random_lengths), "draw lengths uniformly in [0.5, 1.5] × the given ones")
      ("images", po::value(&images)->default_value(images),
       "images per request: each request becomes a chat completion of this many new random PNGs (data: URLs) and "
       "the prompt text, so TTFT includes decoding, the vision tower and the expanded prompt's prefill")
      ("image-size", po::value(&image_size)->default_value(image_size), "pixels per side of each (square) image")
      ("seed", po::value(&seed)->default_value(0), "seed for prompts and lengths")
      ("api-key-env", po::value(&api_key_env), "environment variable holding the API key")
      ("out", po::value(&out_file), "write the results as JSON to this file");
  po::variables_map vm;
  int rc = parse_or_exit(argc, argv, desc, {}, vm,
                         "usage: kiln bench serve [--base-url URL] [--concurrency 1,2,4,...] [--input-len N] [--output-len N] "
                         "[--images N --image-size S]");
  if (rc >= 0) return rc;
  ServerAddress server;
  if (std::string error = connect(base_url, api_key_env, server, model); !error.empty()) return fail(error);
  if (images < 0) return fail("--images must not be negative");
  if (images > 0 && (image_size < 1 || image_size > 16384)) return fail("--image-size must be 1 .. 16384 pixels");
  std::vector<int64_t> conc;
  try {
    conc = parse_int_list(levels);
  } catch (...) {
    return fail("--concurrency `" + levels + "` is not a list of integers");
  }

  nlohmann::json report = {{"model", model}, {"base_url", base_url}, {"input_len", input_len},
                           {"output_len", output_len}, {"random", random_lengths}, {"levels", nlohmann::json::array()}};
  if (images > 0) {
    report["images"] = images;
    report["image_size"] = image_size;
  }
  std::printf("| conc | reqs | fail | req/s | out tok/s | total tok/s | TTFT mean/med/p99 ms | TPOT mean/med/p99 ms | ITL mean/med/p99 ms | E2E mean/med/p99 ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t c : conc) {
    int64_t n = requests_per_level > 0 ? requests_per_level : std::max<int64_t>(8, 4 * c);
    LevelResult r = run_level(server, model, c, n, input_len, output_len, random_lengths, seed, {images, image_size});
    auto ms3 = [](const Summary& s) {
      char b[64];
      std::snprintf(b, sizeof b, "%.1f/%.1f/%.1f", s.mean * 1e3, s.median * 1e3, s.p99 * 1e3);
      return std::string(b);
    };
    std::printf("| %lld | %lld | %lld | %.2f | %.1f | %.1f | %s | %s | %s | %s |\n", static_cast<long long>(c),
                static_cast<long long>(r.requests), static_cast<long long>(r.failed), r.requests / r.duration,
                r.output_tokens / r.duration, (r.input_tokens + r.output_tokens) / r.duration, ms3(r.ttft).c_str(),
                ms3(r.tpot).c_str(), ms3(r.itl).c_str(), ms3(r.e2el).c_str());
    std::fflush(stdout);
    // The prompt the model prefilled (usage): with images, their begin/end markers and placeholders included.
    if (images > 0 && r.requests > 0)
      std::printf("# concurrency %lld: %lld images of %lld² per request, %.1f prompt tokens per request (usage)\n",
                  static_cast<long long>(c), static_cast<long long>(images), static_cast<long long>(image_size),
                  static_cast<double>(r.input_tokens) / static_cast<double>(r.requests));
    if (!r.first_error.empty()) std::fprintf(stderr, "concurrency %lld: %s\n", static_cast<long long>(c), r.first_error.c_str());
    report["levels"].push_back(level_json(r));
  }
  if (!out_file.empty()) std::ofstream(out_file) << json_text(report, 2) << "\n";
  return 0;
}

int bench_depth(int argc, char** argv) {
  std::string base_url = "http://127.0.0.1:8000", model, depths = "4K,32K,65K,131K,240K", out_file, api_key_env;
  int64_t output_len = 128, max_depth = 0;
  po::options_description desc("kiln bench depth options");
  desc.add_options()
      ("help,h", "show this help")
      ("base-url", po::value(&base_url)->default_value(base_url), "server to drive")
      ("model", po::value(&model), "model id (default: the server's first)")
      ("depths", po::value(&depths)->default_value(depths), "context depths in tokens (K = 1024)")
      ("max-depth", po::value(&max_depth), "skip depths above this (the recipe's max_model_len)")
      ("output-len", po::value(&output_len)->default_value(output_len), "tokens to generate at each depth")
      ("api-key-env", po::value(&api_key_env), "environment variable holding the API key")
      ("out", po::value(&out_file), "write the results as JSON to this file");
  po::variables_map vm;
  int rc = parse_or_exit(argc, argv, desc, {}, vm, "usage: kiln bench depth [--base-url URL] [--depths 4K,32K,...]");
  if (rc >= 0) return rc;
  ServerAddress server;
  if (std::string error = connect(base_url, api_key_env, server, model); !error.empty()) return fail(error);
  std::vector<int64_t> ds;
  try {
    ds = parse_int_list(depths);
  } catch (...) {
    return fail("--depths `" + depths + "` is not a list of integers");
  }
  nlohmann::json report = {{"model", model}, {"base_url", base_url}, {"output_len", output_len}, {"depths", nlohmann::json::array()}};
  std::mt19937_64 rng(1);
  std::string probe_error;
  const double tokens_per_word = probe_tokens_per_word(server, model, rng, probe_error);
  if (tokens_per_word <= 0) return fail(probe_error);
  std::printf("| depth | prompt tokens | TTFT s | decode tok/s | ITL median ms |\n|---|---|---|---|---|\n");
  int failed = 0;
  for (int64_t d : ds) {
    if (max_depth > 0 && d + output_len > max_depth) continue;
    DepthResult t = measure_depth(server, model, d, output_len, tokens_per_word, rng);
    if (!t.ok) {
      std::fprintf(stderr, "depth %lld: %s\n", static_cast<long long>(d), t.error.c_str());
      ++failed;
      continue;
    }
    std::printf("| %lld | %lld | %.3f | %.1f | %.2f |\n", static_cast<long long>(d),
                static_cast<long long>(t.prompt_tokens), t.ttft, t.decode_tok_s, t.itl.median * 1e3);
    std::fflush(stdout);
    report["depths"].push_back(depth_json(t));
  }
  if (!out_file.empty()) std::ofstream(out_file) << json_text(report, 2) << "\n";
  // A sweep with a hole in it is not a result a script should carry on with.
  if (failed > 0) return fail(std::to_string(failed) + " of the depths failed (see above)");
  if (report["depths"].empty()) return fail("no depth was measured (all above --max-depth?)");
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  const std::string usage =
      "usage: kiln bench serve [options]   drive a running server at several concurrency levels\n"
      "       kiln bench depth [options]   single-request decode speed and TTFT at several context depths\n"
      "       kiln bench decode RECIPE     the recipe's model in-process: decode tok/s at contexts × batch sizes\n"
      "       kiln bench prefill RECIPE    the recipe's model in-process: prefill tok/s and FLOP rate at prompt lengths";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << usage << "\n";
    return argc < 2 ? 2 : 0;
  }
  std::string what = argv[1];
  if (what == "serve") return bench_serve(argc - 1, argv + 1);
  if (what == "depth") return bench_depth(argc - 1, argv + 1);
  if (what == "decode") return bench_decode(argc - 1, argv + 1);
  if (what == "prefill") return bench_prefill(argc - 1, argv + 1);
  std::cerr << "kiln bench: unknown benchmark `" << what << "`\n" << usage << "\n";
  return 2;
}

}  // namespace kiln::cli
