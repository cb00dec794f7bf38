// The measurements `kiln bench serve`, `kiln bench depth` and `kiln qualify` take of a running server: a
// concurrency level (many streamed requests, so many in flight) and one request at a context depth.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "serve_client.h"

namespace kiln::cli {

struct Summary {
  double mean = 0, median = 0, p99 = 0, stddev = 0;
};
Summary summarize(std::vector<double> v);
nlohmann::json to_json_ms(const Summary& s);

// Prompt text of about `words` tokens: short common words, shuffled per request so prefix caching cannot
// turn the benchmark into a cache benchmark.
std::string make_prompt(int64_t words, std::mt19937_64& rng);

struct LevelResult {
  int64_t concurrency = 0, requests = 0, failed = 0;
  double duration = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  Summary ttft, tpot, itl, e2el;
  std::string first_error;
};

// Images per request (`kiln bench serve --images N --image-size S`): 0 sends text completions.
struct ImageLoad {
  int64_t count = 0;
  int64_t size = 0;  // pixels per side
};

// `num_requests` streamed completions with at most `concurrency` in flight; `random_lengths` draws each length in
// [0.5, 1.5] × the given one. With images, each request is a chat completion of `images.count` new random PNGs
// (made before its clock starts) and the prompt text: its TTFT covers the image path and the expanded prefill.
LevelResult run_level(const ServerAddress& server, const std::string& model, int64_t concurrency, int64_t num_requests,
                      int64_t input_len, int64_t output_len, bool random_lengths, uint64_t seed,
                      const ImageLoad& images = {});
nlohmann::json level_json(const LevelResult& r);

// Depths are in tokens, prompts are words: this server's tokens per word, measured once (0 when the probe fails;
// `error` says why).
double probe_tokens_per_word(const ServerAddress& server, const std::string& model, std::mt19937_64& rng,
                             std::string& error);

struct DepthResult {
  bool ok = false;
  std::string error;
  int64_t depth = 0, prompt_tokens = 0;
  double ttft = 0, decode_tok_s = 0;
  Summary itl;
};

// One request of about `depth` prompt tokens generating `output_len`.
DepthResult measure_depth(const ServerAddress& server, const std::string& model, int64_t depth, int64_t output_len,
                          double tokens_per_word, std::mt19937_64& rng);
nlohmann::json depth_json(const DepthResult& r);

}  // namespace kiln::cli
