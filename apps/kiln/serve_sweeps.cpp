#include "serve_sweeps.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "bench_images.h"

namespace kiln::cli {

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
  return {
      {"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p99_ms", s.p99 * 1e3}, {"std_ms", s.stddev * 1e3}};
}

std::string make_prompt(int64_t words, std::mt19937_64& rng) {
  static const char* kWords[] = {"the",   "kiln", "fire",  "clay",  "pot",   "glaze", "heat", "slow",  "cool", "form",
                                 "wheel", "hand", "shape", "water", "earth", "ash",   "wood", "smoke", "door", "brick"};
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  for (int64_t i = 0; i < words; ++i) s += (i ? " " : "") + std::string(kWords[pick(rng)]);
  return s;
}

LevelResult run_level(const ServerAddress& server, const std::string& model, int64_t concurrency, int64_t num_requests,
                      int64_t input_len, int64_t output_len, bool random_lengths, uint64_t seed,
                      const ImageLoad& images) {
  LevelResult r;
  r.concurrency = concurrency;
  std::vector<StreamTiming> results(num_requests);
  std::atomic<int64_t> next{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < concurrency; ++w)
    workers.emplace_back([&, w] {
      // The level's concurrency in the seed too: otherwise worker w sends the same prompts at every level, and each
      // level after the first measures prefix-cache hits instead of prefills.
      std::mt19937_64 rng(seed * 7919 + w + static_cast<uint64_t>(concurrency) * 1000003);
      for (int64_t i; (i = next++) < num_requests;) {
        std::uniform_real_distribution<double> jitter(0.5, 1.5);
        int64_t in = random_lengths ? std::max<int64_t>(1, std::llround(input_len * jitter(rng))) : input_len;
        int64_t out = random_lengths ? std::max<int64_t>(1, std::llround(output_len * jitter(rng))) : output_len;
        if (images.count <= 0) {
          results[i] = timed_completion(server, model, make_prompt(in, rng), out, /*ignore_eos=*/true);
          continue;
        }
        std::vector<std::string> urls;
        try {
          for (int64_t k = 0; k < images.count; ++k) urls.push_back(png_data_url(random_png(images.size, rng)));
        } catch (const std::exception& e) {
          results[i].error = std::string("making the request's images: ") + e.what();
          continue;
        }
        results[i] = timed_chat(server, model, make_prompt(in, rng), urls, out, /*ignore_eos=*/true);
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

nlohmann::json level_json(const LevelResult& r) {
  return {{"concurrency", r.concurrency},
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
          {"e2el", to_json_ms(r.e2el)}};
}

double probe_tokens_per_word(const ServerAddress& server, const std::string& model, std::mt19937_64& rng,
                             std::string& error) {
  constexpr int64_t kProbeWords = 200;
  StreamTiming probe = timed_completion(server, model, make_prompt(kProbeWords, rng), 1, true);
  if (!probe.ok || probe.prompt_tokens <= 0) {
    error = "probe request failed: " + probe.error;
    return 0;
  }
  return static_cast<double>(probe.prompt_tokens) / kProbeWords;
}

DepthResult measure_depth(const ServerAddress& server, const std::string& model, int64_t depth, int64_t output_len,
                          double tokens_per_word, std::mt19937_64& rng) {
  DepthResult r;
  r.depth = depth;
  const int64_t words = std::max<int64_t>(1, static_cast<int64_t>(depth / tokens_per_word));
  StreamTiming t = timed_completion(server, model, make_prompt(words, rng), output_len, true);
  if (!t.ok) {
    r.error = t.error;
    return r;
  }
  r.ok = true;
  r.prompt_tokens = t.prompt_tokens;
  r.ttft = t.ttft;
  r.decode_tok_s = t.completion_tokens > 1 ? (t.completion_tokens - 1) / (t.latency - t.ttft) : 0;
  r.itl = summarize(t.itl);
  return r;
}

nlohmann::json depth_json(const DepthResult& r) {
  return {{"depth", r.depth},
          {"prompt_tokens", r.prompt_tokens},
          {"ttft_s", r.ttft},
          {"decode_tok_s", r.decode_tok_s},
          {"itl", to_json_ms(r.itl)}};
}

}  // namespace kiln::cli
