// c1 decode on one GPU through the CUDA runner, with dummy (random, made on the device) bf16 weights of a model's
// published shapes (default: GLM-4.7-Flash, configs/models/glm-4.7-flash/config.json), at several context lengths.
// Each step is what the engine runs: one token through ModelRunner::forward, logits copied to the host. The KV
// pages before the context are zeros (their values do not change the work); the roofline beside each figure is
// (active weight bytes + KV bytes read) ÷ HBM bandwidth, active = attention + dense / shared MLP + top-k routed
// experts of every layer + the router (fp32) + one embedding row + lm_head.
//
//   kiln_bench_gpu_decode [--config PATH] [--contexts 4096,32768,131072] [--steps 64] [--prefill 4096]
//                         [--graphs 1] [--bandwidth 4.26e12]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "runtime/cuda/cuda_mla_moe_model.h"

namespace {

using kiln::ModelConfig;

double active_weight_bytes(const ModelConfig& c) {
  const double Hd = c.hidden_size, H = c.num_attention_heads, L = c.kv_lora_rank, R = c.qk_rope_head_dim;
  const double qk = c.qk_nope_head_dim + R, vd = c.v_head_dim, bf16 = 2;
  const double q = c.q_lora_rank > 0 ? Hd * c.q_lora_rank + c.q_lora_rank * H * qk : Hd * H * qk;
  const double attention = (q + Hd * (L + R) + L * H * (c.qk_nope_head_dim + vd) + H * vd * Hd) * bf16;
  double total = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += attention;
    if (!c.is_moe(l)) {
      total += 3.0 * Hd * c.intermediate_size * bf16;
    } else {
      const double expert = 3.0 * Hd * c.moe_intermediate_size * bf16;
      total += expert * (c.num_experts_per_tok + c.n_shared_experts) + 4.0 * Hd * c.n_routed_experts;
    }
  }
  return total + Hd * bf16 + static_cast<double>(c.vocab_size) * Hd * bf16;
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = std::string(KILN_BENCH_SOURCE_DIR) + "/configs/models/glm-4.7-flash/config.json";
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int64_t steps = 64;
  bool graphs = true;       // replay decode steps from CUDA graphs
  int64_t prefill = 4096;  // one prompt of this many tokens, timed once (0: skip)
  double bandwidth = 4.26e12;  // device-to-device copy measured on the H200 here (bench/RESULTS.md)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--config") config_path = v;
    else if (a == "--contexts") contexts = parse_list(v);
    else if (a == "--steps") steps = std::stoll(v);
    else if (a == "--prefill") prefill = std::stoll(v);
    else if (a == "--graphs") graphs = v != "0";
    else if (a == "--bandwidth") bandwidth = std::stod(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto config = ModelConfig::load(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().to_string().c_str());
    return 1;
  }
  const ModelConfig& c = *config;
  auto model = kiln::cuda::CudaMlaMoeModel::create(c, nullptr, /*seed=*/1);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  (*model)->set_cuda_graphs(graphs);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double weights = active_weight_bytes(c);
  std::printf("%s on %s: %.2f GiB of dummy bf16 weights, %.1f MB active per token, CUDA graphs %s\n",
              config_path.c_str(), prop.name, static_cast<double>((*model)->weight_bytes()) / (1 << 30), weights / 1e6,
              graphs ? "on" : "off");

  constexpr int64_t kBlock = 64;
  int64_t max_ctx = 0;
  for (int64_t ctx : contexts) max_ctx = std::max(max_ctx, ctx);
  const int64_t blocks = (max_ctx + steps + 8 + kBlock - 1) / kBlock;
  auto runner = (*model)->make_runner(blocks, kBlock);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().to_string().c_str());
    return 1;
  }
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  if (prefill > 0) {
    // Prefill runs every query row through the decode attention kernel (no tensor-core prefill kernel yet).
    std::vector<int32_t> prompt(prefill);
    for (int64_t i = 0; i < prefill; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    kiln::SequenceStep s{prompt, 0, &table, false};
    kiln::StepOutput out;
    double secs = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first pass sizes the activation buffers
      const auto t0 = std::chrono::steady_clock::now();
      const kiln::Status st = (*runner)->forward({&s, 1}, out, false);
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
    }
    std::printf("prefill %lld tokens: %.1f ms, %.0f tok/s\n\n", static_cast<long long>(prefill), secs * 1e3, prefill / secs);
  }
  std::printf("| context | c1 decode tok/s | ms/token | roofline tok/s | %% of roofline |\n|---|---|---|---|---|\n");
  for (int64_t ctx : contexts) {
    kiln::StepOutput out;
    int32_t token = 11;
    auto step = [&](int64_t pos) {
      kiln::SequenceStep s{{&token, 1}, pos, &table, false};
      const kiln::Status st = (*runner)->forward({&s, 1}, out, false);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        std::exit(1);
      }
      token = static_cast<int32_t>((token * 7919 + 13) % c.vocab_size);
    };
    for (int64_t w = 0; w < 4; ++w) step(ctx + w);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) step(ctx + 4 + i);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = steps / secs;
    const double kv_bytes = static_cast<double>(ctx) * c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 2;
    const double roof = bandwidth / (weights + kv_bytes);
    std::printf("| %lld | %.1f | %.3f | %.1f | %.1f%% |\n", static_cast<long long>(ctx), tps, 1e3 / tps, roof,
                100.0 * tps / roof);
  }
  return 0;
}
