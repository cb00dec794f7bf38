// The weights of an MLA + MoE model in device memory, bf16 (router fp32, as the gate runs in fp32), uploaded
// from the checkpoint or, for benchmarks, generated on the device with the config's shapes (model.load = "dummy").
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/stream_handle.h"
#include "kiln/weight_format.h"
#include "model/model_config.h"
#include "runtime/cuda/device_arena.h"

namespace kiln::cuda {

struct GpuLinear {
  const uint16_t* w = nullptr;  // bf16 [out, in], nn.Linear's layout
  int64_t in = 0, out = 0;
};

struct GpuLayer {
  const uint16_t *input_norm = nullptr, *post_attention_norm = nullptr;
  GpuLinear q_a, q_b, q_proj, kv_a, kv_b, o_proj;
  const uint16_t *q_a_norm = nullptr, *kv_a_norm = nullptr;
  // kv_b is [H, nope + v, L]: W_UK of head h is rows h·(nope+v) .. +nope, W_UV the v rows after them; the
  // absorption GEMMs address both as strided batches over heads, so no split copy is needed.
  bool is_moe = false;
  GpuLinear gate_up, down;  // the dense MLP, or the shared expert(s) of a MoE layer ([2·I, hidden], gate rows first)
  bool has_shared = false;
  const float* router = nullptr;       // fp32 [E, hidden]
  const float* router_bias = nullptr;  // fp32 [E]
  const uint16_t* experts_gate_up = nullptr;  // [E, 2·moe_inter, hidden]
  const uint16_t* experts_down = nullptr;     // [E, hidden, moe_inter]
};

struct GpuWeights {
  const uint16_t* embed_tokens = nullptr;  // [vocab, hidden]
  std::vector<GpuLayer> layers;
  const uint16_t* final_norm = nullptr;
  GpuLinear lm_head;
  size_t bytes = 0;
};

// source == nullptr: dummy weights (uniform with std 0.02, HF's default initializer_range; norms 1, router bias 0),
// generated on `stream` from `seed`. Errors name the tensor.
Result<GpuWeights> load_gpu_weights(const ModelConfig& config, const WeightSource* source, DeviceArena& arena,
                                    uint64_t seed, StreamHandle stream);

}  // namespace kiln::cuda
