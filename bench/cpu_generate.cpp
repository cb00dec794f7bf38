// CPU prefill and decode speed of a recipe's model (default: the embedded tiny model), llama-bench style:
// pp<N> = prompt processing of N tokens, tg<N> = generating N tokens, mean ± stddev over repetitions.
//   kiln_bench_cpu_generate [recipe] [--pp 512] [--tg 128] [--reps 5]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include "engine/engine_factory.h"
#include "engine/single_request.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace {

struct Stat {
  double mean = 0, stddev = 0;
};

Stat stats(const std::vector<double>& v) {
  Stat s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / (v.size() - 1)) : 0;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string recipe_path = std::string(KILN_BENCH_SOURCE_DIR) + "/configs/tiny-cpu.toml";
  int64_t pp = 512, tg = 128, reps = 5;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() { return i + 1 < argc ? std::stoll(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--pp")) pp = next();
    else if (!std::strcmp(argv[i], "--tg")) tg = next();
    else if (!std::strcmp(argv[i], "--reps")) reps = next();
    else recipe_path = argv[i];
  }
  // One sequence at a time, with room for the prompt and the generated tokens (no prefix cache: every repetition
  // computes its prompt).
  auto recipe = kiln::load_recipe(recipe_path,
                                  {"scheduler.max_num_seqs=1", "scheduler.prefix_caching=false",
                                   "scheduler.max_model_len=" + std::to_string(pp + tg)},
                                  kiln::global_registry());
  if (!recipe.ok()) return std::fprintf(stderr, "%s\n", recipe.status().to_string().c_str()), 1;
  auto m = kiln::load_model(*recipe, kiln::global_registry());
  if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().to_string().c_str()), 1;
  auto started = kiln::start_engine(*m, *recipe);
  if (!started.ok()) return std::fprintf(stderr, "%s\n", started.status().to_string().c_str()), 1;
  const kiln::ModelInfo& c = m->info;

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<double> pp_tps, tg_tps;
  for (int64_t r = 0; r <= reps; ++r) {  // repetition 0 warms up and is not counted
    std::vector<int32_t> prompt(pp);
    for (auto& t : prompt) t = tok(rng);
    kiln::RequestParams request;
    request.prompt = prompt;
    request.max_tokens = tg;
    kiln::SingleRequestStats st;
    auto out = kiln::run_single_request(*started->engine, std::move(request), nullptr, &st);
    if (!out.ok()) return std::fprintf(stderr, "%s\n", out.status().to_string().c_str()), 1;
    if (r == 0) continue;
    pp_tps.push_back(st.prompt_tokens / st.prefill_seconds);
    tg_tps.push_back((st.generated_tokens - 1) / st.decode_seconds);
  }
  Stat p = stats(pp_tps), g = stats(tg_tps);
  std::printf("| model | threads | test | t/s |\n|---|---|---|---|\n");
  std::printf("| %s (%s) | %d | pp%lld | %.1f ± %.1f |\n", c.model_type.c_str(), recipe_path.c_str(), omp_get_max_threads(),
              static_cast<long long>(pp), p.mean, p.stddev);
  std::printf("| %s (%s) | %d | tg%lld | %.1f ± %.1f |\n", c.model_type.c_str(), recipe_path.c_str(), omp_get_max_threads(),
              static_cast<long long>(tg), g.mean, g.stddev);
  return 0;
}
