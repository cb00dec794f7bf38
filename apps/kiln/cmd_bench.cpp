// `kiln bench serve` and `kiln bench depth`: clients that measure a running `kiln serve` (or any
// OpenAI-compatible server) the way serving campaigns do (vLLM's bench serve; the seeds' depth sweep).
// `kiln bench decode|prefill` time a recipe's model in-process (cmd_bench_model.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "serve_client.h"

namespace kiln::cli {
namespace {

struct Summary {
  double mean = 0, median = 0, p99 = 0, stddev = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(s.stddev / v.size());
  auto pct = [&](double q) {
    double idx = q * (v.size() - 1);
    size_t lo = static_cast<size_t>(idx);
    size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - lo);
  };
  s.median = pct(0.5);
  s.p99 = pct(0.99);
  return s;
}

nlohmann::json to_json_ms(const Summary& s) {
  return {{"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p99_ms", s.p99 * 1e3}, {"std_ms", s.stddev * 1e3}};
}

// Prompt text of about `words` tokens: short common words, shuffled per request so prefix caching cannot
// turn the benchmark into a cache benchmark.
std::string make_prompt(int64_t words, std::mt19937_64& rng) {
  static const char* kWords[] = {"the", "kiln", "fire", "clay", "pot", "glaze", "heat", "slow", "cool", "form",
                                 "wheel", "hand", "shape", "water", "earth", "ash", "wood", "smoke", "door", "brick"};
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  for (int64_t i = 0; i < words; ++i) s += (i ? " " : "") + std::string(kWords[pick(rng)]);
  return s;
}

struct LevelResult {
  int64_t concurrency = 0, requests = 0, failed = 0;
  double duration = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  Summary ttft, tpot, itl, e2el;
  std::string first_error;
};

// Resolves --base-url, the API key and the model id (the server's first when not given); an error message or "".
std::string connect(const std::string& base_url, const std::string& api_key_env, ServerAddress& server, std::string& model) {
  if (!parse_base_url(base_url, server)) return "--base-url `" + base_url + "` is not http://host:port";
  if (!api_key_env.empty())
    if (const char* k = std::getenv(api_key_env.c_str())) server.api_key = k;
  if (model.empty()) model = first_model(server);
  if (model.empty()) return "no server answered GET /v1/models at " + base_url;
  return "";
}

LevelResult run_level(const ServerAddress& server, const std::string& model, int64_t concurrency, int64_t num_requests,
                      int64_t input_len, int64_t output_len, bool random_lengths, uint64_t seed) {
  LevelResult r;
  r.concurrency = concurrency;
  std::vector<StreamTiming> results(num_requests);
  std::atomic<int64_t> next{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < concurrency; ++w)
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 7919 + w);
      for (int64_t i; (i = next++) < num_requests;) {
        std::uniform_real_distribution<double> jitter(0.5, 1.5);
        int64_t in = random_lengths ? std::max<int64_t>(1, std::llround(input_len * jitter(rng))) : input_len;
        int64_t out = random_lengths ? std::max<int64_t>(1, std::llround(output_len * jitter(rng))) : output_len;
        results[i] = timed_completion(server, model, make_prompt(in, rng), out, /*ignore_eos=*/true);
      }
    });
  for (auto& t : workers) t.join();
  r.duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> ttft, tpot, itl, e2el;
  for (const auto& t : results) {
    if (!t.ok) {
      ++r.failed;
      if (r.first_error.empty()) r.first_error = t.error;
      continue;
    }
    ++r.requests;
    r.input_tokens += t.prompt_tokens;
    r.output_tokens += t.completion_tokens;
    ttft.push_back(t.ttft);
    e2el.push_back(t.latency);
    if (t.completion_tokens > 1) tpot.push_back((t.latency - t.ttft) / (t.completion_tokens - 1));
    itl.insert(itl.end(), t.itl.begin(), t.itl.end());
  }
  r.ttft = summarize(ttft);
  r.tpot = summarize(tpot);
  r.itl = summarize(itl);
  r.e2el = summarize(e2el);
  return r;
}

int bench_serve(int argc, char** argv) {
  std::string base_url = "http://127.0.0.1:8000", model, levels = "1,2,4,8,16", out_file, api_key_env;
  int64_t requests_per_level = 0, input_len = 128, output_len = 64;
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
      ("seed", po::value(&seed)->default_value(0), "seed for prompts and lengths")
      ("api-key-env", po::value(&api_key_env), "environment variable holding the API key")
      ("out", po::value(&out_file), "write the results as JSON to this file");
  po::variables_map vm;
  int rc = parse_or_exit(argc, argv, desc, {}, vm,
                         "usage: kiln bench serve [--base-url URL] [--concurrency 1,2,4,...] [--input-len N] [--output-len N]");
  if (rc >= 0) return rc;
  ServerAddress server;
  if (std::string error = connect(base_url, api_key_env, server, model); !error.empty()) return fail(error);
  std::vector<int64_t> conc;
  try {
    conc = parse_int_list(levels);
  } catch (...) {
    return fail("--concurrency `" + levels + "` is not a list of integers");
  }

  nlohmann::json report = {{"model", model}, {"base_url", base_url}, {"input_len", input_len},
                           {"output_len", output_len}, {"random", random_lengths}, {"levels", nlohmann::json::array()}};
  std::printf("| conc | reqs | fail | req/s | out tok/s | total tok/s | TTFT mean/med/p99 ms | TPOT mean/med/p99 ms | ITL mean/med/p99 ms | E2E mean/med/p99 ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t c : conc) {
    int64_t n = requests_per_level > 0 ? requests_per_level : std::max<int64_t>(8, 4 * c);
    LevelResult r = run_level(server, model, c, n, input_len, output_len, random_lengths, seed);
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
    if (!r.first_error.empty()) std::fprintf(stderr, "concurrency %lld: %s\n", static_cast<long long>(c), r.first_error.c_str());
    report["levels"].push_back({{"concurrency", c},
                                {"completed", r.requests},
                                {"failed", r.failed},
                                {"duration_s", r.duration},
                                {"request_throughput", r.requests / r.duration},
                                {"output_throughput", r.output_tokens / r.duration},
                                {"total_token_throughput", (r.input_tokens + r.output_tokens) / r.duration},
                                {"mean_input_tokens", r.requests ? double(r.input_tokens) / r.requests : 0.0},
                                {"ttft", to_json_ms(r.ttft)},
                                {"tpot", to_json_ms(r.tpot)},
                                {"itl", to_json_ms(r.itl)},
                                {"e2el", to_json_ms(r.e2el)}});
  }
  if (!out_file.empty()) std::ofstream(out_file) << report.dump(2) << "\n";
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
  // Depths are in tokens, prompts are words: measure this server's tokens per word once and size prompts by it.
  std::mt19937_64 rng(1);
  constexpr int64_t kProbeWords = 200;
  StreamTiming probe = timed_completion(server, model, make_prompt(kProbeWords, rng), 1, true);
  if (!probe.ok || probe.prompt_tokens <= 0) return fail("probe request failed: " + probe.error);
  const double tokens_per_word = static_cast<double>(probe.prompt_tokens) / kProbeWords;
  std::printf("| depth | prompt tokens | TTFT s | decode tok/s | ITL median ms |\n|---|---|---|---|---|\n");
  int failed = 0;
  for (int64_t d : ds) {
    if (max_depth > 0 && d + output_len > max_depth) continue;
    const int64_t words = std::max<int64_t>(1, static_cast<int64_t>(d / tokens_per_word));
    StreamTiming t = timed_completion(server, model, make_prompt(words, rng), output_len, true);
    if (!t.ok) {
      std::fprintf(stderr, "depth %lld: %s\n", static_cast<long long>(d), t.error.c_str());
      ++failed;
      continue;
    }
    double decode = t.completion_tokens > 1 ? (t.completion_tokens - 1) / (t.latency - t.ttft) : 0;
    Summary itl = summarize(t.itl);
    std::printf("| %lld | %lld | %.3f | %.1f | %.2f |\n", static_cast<long long>(d),
                static_cast<long long>(t.prompt_tokens), t.ttft, decode, itl.median * 1e3);
    std::fflush(stdout);
    report["depths"].push_back({{"depth", d}, {"prompt_tokens", t.prompt_tokens}, {"ttft_s", t.ttft},
                                {"decode_tok_s", decode}, {"itl", to_json_ms(itl)}});
  }
  if (!out_file.empty()) std::ofstream(out_file) << report.dump(2) << "\n";
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
