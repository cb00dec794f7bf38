// The built-in `dense` weight format: Linear and ExpertSet layers over the checkpoint's bf16 / fp16 / fp32
// tensors as stored, without copying (the WeightSource's views are an mmap that outlives these objects).
// CPU only for now: forward runs kernels/cpu/gemm.
#pragma once

#include <memory>

#include "kiln/weight_format.h"

namespace kiln::builtin {

Result<std::unique_ptr<WeightFormat>> create_dense_weight_format(const CreateContext& context);

}  // namespace kiln::builtin
