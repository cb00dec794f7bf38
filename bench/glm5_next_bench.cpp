// GLM-5.3-Flash (glm5_next) on the GPU with dummy weights: single-sequence decode at context lengths and prefill
// at prompt lengths, each beside its roofline, with where a step's time goes per layer type.
//   kiln_bench_glm5_next_bench [RECIPE] [--contexts 4096,32768,131072,1048576] [--steps 32] [--prefill 4096,32768]
//                              [--chunk 4096] [--bandwidth 4.26e12] [--flops 989e12]
// Decode steps run as the engine runs them (CUDA graphs, greedy selection on the device); the KV and state they
// read are whatever the pool holds (a step's cost does not depend on the values). A decode step's DSA layers
// attend over their selection (top 2048 + the tail pool, all keys below that) and score every complete pool, so
// their cost grows with context only through the indexer; the KDA layers' state is the same size at any context.
// Rooflines: decode = bandwidth / bytes a step must read (the weights it touches: every dense weight, top-k of the
// routed experts, one embedding row; each DSA layer's selected latents, its pool keys and indexer rows written;
// each KDA layer's 4 MiB state read and written); prefill = flops / FLOPs a token costs (2 × active parameters,
// plus absorbed attention over the keys a query sees). Per-stage times come from separate un-graphed steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cache_manager.h"
#include "kiln/log.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace {

using Clock = std::chrono::steady_clock;
using kiln::glm5_next::Glm5NextConfig;

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

int die(const kiln::Status& s) {
  std::fprintf(stderr, "%s\n", s.to_string().c_str());
  return 1;
}

struct LayerCounts {
  int64_t kda = 0, dsa = 0, indexers = 0, moe = 0, dense = 0;
};

LayerCounts count_layers(const Glm5NextConfig& c) {
  LayerCounts n;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    (c.is_kda(l) ? n.kda : n.dsa) += 1;
    n.indexers += c.runs_indexer(l);
    (c.moe[l] ? n.moe : n.dense) += 1;
  }
  return n;
}

// Bytes of weights one decode token reads: all the model holds, less the routed experts it does not use and the
// embedding rows it does not look up.
double decode_weight_bytes(const Glm5NextConfig& c, const LayerCounts& n, double weight_bytes) {
  const double expert = 3.0 * c.hidden_size * c.moe_intermediate_size * 2;
  const double unused = n.moe * (c.n_routed_experts - c.num_experts_per_tok) * expert;
  const double embed = static_cast<double>(c.vocab_size) * c.hidden_size * 2;
  return weight_bytes - unused - embed;
}

// Cache bytes one decode token at `context` reads or writes.
double decode_cache_bytes(const Glm5NextConfig& c, const LayerCounts& n, double context) {
  const double latent = c.kv_lora_rank * 2.0;
  const double keys = std::min<double>(context + 1, static_cast<double>(c.selection_width()));
  const double pools = std::floor((context + 1) / c.index_kpool);
  const double dsa = n.dsa * (keys * latent + latent) + n.indexers * (pools * c.index_head_dim * 4.0 + 2.0 * c.index_head_dim * 4);
  const double kda = n.kda * 2.0 * static_cast<double>(c.kda_state_bytes());
  return dsa + kda;
}

// FLOPs of one prefill token at position p (2 per multiply-add): the active parameters, plus absorbed attention
// over the keys it sees (q·c and p·c over the 512-wide latent per head) and the indexer's pool scores.
double prefill_flops(const Glm5NextConfig& c, const LayerCounts& n, double active_params, double p) {
  const double keys = std::min<double>(p + 1, static_cast<double>(c.selection_width()));
  const double attn = n.dsa * 2.0 * 2.0 * c.num_attention_heads * c.kv_lora_rank * keys;
  const double index = n.indexers * 2.0 * c.index_n_heads * c.index_head_dim * std::floor((p + 1) / c.index_kpool);
  // KDA chunked form per token and head: about 4·dk·dv for the state update and output, 2·C·(dk + dv) intra-chunk.
  const double kda = n.kda * c.linear_num_heads * (4.0 * 128 * 128 + 2.0 * 64 * 256);
  return 2.0 * active_params + attn + index + kda;
}

}  // namespace

int main(int argc, char** argv) {
  std::string recipe_path = std::string(KILN_BENCH_SOURCE_DIR) + "/configs/glm-5.3-flash-8layer-dummy.toml";
  std::vector<int64_t> contexts = {4096, 32768, 131072, 1048576}, prefill = {4096, 32768};
  int64_t steps = 32, chunk = 4096;
  double bandwidth = 4.26e12, flops = 989e12;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--contexts") && more) contexts = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--prefill") && more) prefill = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && more) steps = std::stoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--chunk") && more) chunk = std::stoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--bandwidth") && more) bandwidth = std::stod(argv[++i]);
    else if (!std::strcmp(argv[i], "--flops") && more) flops = std::stod(argv[++i]);
    else recipe_path = argv[i];
  }
  auto recipe = kiln::load_recipe(recipe_path, {}, kiln::global_registry());
  if (!recipe.ok()) return die(recipe.status());
  auto m = kiln::load_model(*recipe, kiln::global_registry());
  if (!m.ok()) return die(m.status());
  const auto* arch = dynamic_cast<const kiln::arch::Glm5NextArchitecture*>(m->arch.get());
  if (!arch || !m->on_gpu()) return die(kiln::invalid_argument(recipe_path + ": needs a glm5_next model on CUDA"));
  const Glm5NextConfig& c = arch->config();
  const LayerCounts n = count_layers(c);
  const double weight_bytes = static_cast<double>(m->model->weight_bytes());

  // One sequence on whole pages: the longest context plus the steps after it, or the longest prompt.
  const int64_t bs = m->layout->geometry().block_size;
  int64_t positions = 0;
  for (int64_t ctx : contexts) positions = std::max(positions, std::min(ctx, c.max_position_embeddings - 4 - steps) + steps + 8);
  for (int64_t len : prefill) positions = std::max(positions, len);
  kiln::CacheManagerConfig cfg;
  cfg.block_size = bs;
  cfg.num_blocks = (positions + bs - 1) / bs + 1;
  cfg.prefix_caching = false;
  cfg.state_slots = 1;
  auto caches = kiln::CacheManager::create(m->arch->cache_spec(0, m->layout->indexer_key_format()), m->layout.get(), m->device.get(), cfg);
  if (!caches.ok()) return die(caches.status());
  std::vector<int32_t> table(cfg.num_blocks - 1);
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  const kiln::CacheViews& views = (*caches)->views();

  std::printf("glm5_next bench: %s, %lld layers (%lld KDA, %lld DSA, %lld MoE), %.2f GiB of bf16 weights (dummy)\n",
              recipe_path.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(n.kda),
              static_cast<long long>(n.dsa), static_cast<long long>(n.moe), weight_bytes / (1 << 30));
  kiln::ModelInstance& model = *m->model;
  kiln::StepOutput out;
  kiln::TokenSelection greedy;
  greedy.select = true;
  auto step = [&](const int32_t* tokens, int64_t count, int64_t start) {
    kiln::SequenceStep s{{tokens, static_cast<size_t>(count)}, start, &table, false, 0, {}};
    return model.step({&s, 1}, {&greedy, 1}, views, {}, out);
  };
  const int32_t token = 4242;

  // Decode.
  std::printf("\n| context | tok/s | ms/step | roofline tok/s | %% of roofline | GB read/step | KDA layer ms | DSA layer ms "
              "| MoE MLP ms | dense MLP ms | mHC ms/layer |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t& ctx : contexts)  // the last steps must stay inside max_position_embeddings
    ctx = std::min(ctx, c.max_position_embeddings - 4 - steps);
  for (int64_t ctx : contexts) {
    // Position 0 first: the step resets the sequence's KDA state, as a new sequence's would be.
    if (auto s = step(&token, 1, 0); !s.ok()) return die(s);
    model.set_graphs(true);
    for (int64_t w = 0; w < 4; ++w)
      if (auto s = step(&token, 1, ctx + w); !s.ok()) return die(s);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i)
      if (auto s = step(&token, 1, ctx + 4 + i); !s.ok()) return die(s);
    const double ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count() / steps;
    // Where the time goes: the same steps un-graphed, timed per stage.
    model.set_graphs(false);
    model.set_step_profiling(true);
    model.clear_step_profile();
    for (int64_t i = 0; i < 8; ++i)
      if (auto s = step(&token, 1, ctx + 4 + i); !s.ok()) return die(s);
    std::map<std::string, double> stage;
    for (auto [name, total] : model.step_profile()) stage[name] = total / model.profiled_steps();
    model.set_step_profiling(false);
    model.set_graphs(true);
    double kda = 0, dsa = 0, moe = 0, dense = 0, mhc = 0;
    for (auto& [name, t] : stage) {
      if (name.rfind("KDA", 0) == 0) kda += t;
      else if (name.rfind("attention", 0) == 0) dsa += t;
      else if (name.rfind("MoE", 0) == 0) moe += t;
      else if (name.rfind("dense MLP", 0) == 0) dense += t;
      else if (name.rfind("mHC", 0) == 0) mhc += t;
    }
    const double bytes = decode_weight_bytes(c, n, weight_bytes) + decode_cache_bytes(c, n, static_cast<double>(ctx));
    const double roof = bandwidth / bytes;
    std::printf("| %lld | %.1f | %.3f | %.1f | %.1f %% | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                static_cast<long long>(ctx), 1e3 / ms, ms, roof, 100.0 * (1e3 / ms) / roof, bytes / 1e9,
                n.kda ? kda / n.kda : 0.0, n.dsa ? dsa / n.dsa : 0.0, n.moe ? moe / n.moe : 0.0,
                n.dense ? dense / n.dense : 0.0, mhc / c.num_hidden_layers);
    std::fflush(stdout);
    if (ctx == contexts.front()) {
      std::printf("\nstages at context %lld (ms/step, un-graphed):\n", static_cast<long long>(ctx));
      for (auto& [name, t] : stage) std::printf("  %-50s %.3f\n", name.c_str(), t);
      std::printf("\n");
    }
  }

  // Prefill.
  const double active = decode_weight_bytes(c, n, weight_bytes) / 2 - static_cast<double>(c.vocab_size) * c.hidden_size;
  std::printf("\n| prompt | chunk | tok/s | s | TFLOP/s | roofline tok/s | %% of roofline |\n|---|---|---|---|---|---|---|\n");
  std::vector<int32_t> prompt(*std::max_element(prefill.begin(), prefill.end()));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  model.set_graphs(true);
  if (auto s = step(prompt.data(), std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size())), 0); !s.ok()) return die(s);
  for (int64_t len : prefill) {
    const auto t0 = Clock::now();
    for (int64_t at = 0; at < len; at += chunk)
      if (auto s = step(prompt.data() + at, std::min(chunk, len - at), at); !s.ok()) return die(s);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    double work = 0;
    for (int64_t p = 0; p < len; ++p) work += prefill_flops(c, n, active, static_cast<double>(p));
    const double roof = flops / (work / len);
    std::printf("| %lld | %lld | %.0f | %.3f | %.1f | %.0f | %.1f %% |\n", static_cast<long long>(len),
                static_cast<long long>(chunk), len / sec, sec, work / sec / 1e12, roof, 100.0 * (len / sec) / roof);
    std::fflush(stdout);
  }
  return 0;
}
