// The built-in `dense` weight format. On the CPU: Linear and ExpertSet layers over the checkpoint's bf16 / fp16 /
// fp32 tensors as stored, without copying (the WeightSource's views are an mmap that outlives these objects), fp32
// activations. On CUDA: bf16 copies in device memory (builtin/cuda/dense_cuda_weights.cpp), bf16 activations,
// the tensor-core and weight-streaming kernels of kernels/cuda.
#pragma once

#include <memory>
#include <string>

#include "kiln/weight_format.h"

namespace kiln::builtin {

Result<std::unique_ptr<WeightFormat>> create_dense_weight_format(const CreateContext& context);

// The device halves (the CUDA one is defined only in CUDA builds).
Result<std::unique_ptr<WeightFormat>> create_dense_cpu_weight_format(const CreateContext& context);
Result<std::unique_ptr<WeightFormat>> create_dense_cuda_weight_format(const CreateContext& context);

// Fetches `name` and checks it is a contiguous host matrix of a dense dtype (F32, BF16, F16) with the expected
// shape (a dimension of −1 accepts any size). Errors name the tensor.
Result<TensorView> get_dense_matrix(const WeightSource& source, const std::string& name, int64_t rows, int64_t cols);

// Checks a LinearSpec is well formed (as many out sizes as names, every size positive), naming its first module.
Status check_linear_spec(const LinearSpec& spec);

}  // namespace kiln::builtin
