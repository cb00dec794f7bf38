// The CPU model's arithmetic (recipe key model.precision).
#pragma once

namespace kiln {

// kFp32: weights widened exactly, activations in fp32 (the reference against transformers).
// kBf16: the CUDA runner's rounding — weights rounded to bf16 at load (the MoE router and the DSA indexer's key
// LayerNorm stay fp32, as on the GPU) and activations rounded to bf16 wherever the GPU stores them in bf16
// (MlaMoeModel and glm5_next's Glm5NextModel mark the points), so the two differ by fp32 summation order and
// whatever the GPU's kernels round internally (glm5_next: tf32 KDA chunks, bf16 softmax weights in attention).
enum class Precision { kFp32, kBf16 };

}  // namespace kiln
