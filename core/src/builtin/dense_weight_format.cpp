#include "builtin/dense_weight_format.h"

#include <string>

namespace kiln::builtin {

Result<TensorView> get_dense_matrix(const WeightSource& source, const std::string& name, int64_t rows, int64_t cols) {
  if (!source.has(name)) return not_found("tensor `" + name + "` is not in the checkpoint");
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(name));
  if (t.rank != 2) return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", expected a 2-D matrix");
  if ((rows >= 0 && t.shape[0] != rows) || (cols >= 0 && t.shape[1] != cols))
    return invalid_argument("tensor `" + name + "` has shape " + t.shape_string() + ", the config implies [" +
                            (rows >= 0 ? std::to_string(rows) : "*") + ", " + (cols >= 0 ? std::to_string(cols) : "*") +
                            "]");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return invalid_argument("tensor `" + name + "` is " + dtype_name(t.dtype) +
                            "; the `dense` weight format serves F32, BF16 and F16 (quantized checkpoints need their "
                            "weight-format plugin)");
  if (!t.device.is_cpu() || !t.is_contiguous())
    return invalid_argument("tensor `" + name + "` must be a contiguous host tensor (got " + t.device.to_string() + ")");
  return t;
}

Status check_linear_spec(const LinearSpec& spec) {
  if (spec.names.empty()) return invalid_argument("a linear layer was requested with no module name");
  if (spec.names.size() != spec.out_features.size())
    return invalid_argument("`" + spec.names[0] + "`: " + std::to_string(spec.names.size()) + " modules but " +
                            std::to_string(spec.out_features.size()) + " output sizes");
  if (spec.in_features <= 0) return invalid_argument("`" + spec.names[0] + "`: in_features must be positive");
  for (size_t i = 0; i < spec.names.size(); ++i)
    if (spec.out_features[i] <= 0) return invalid_argument("`" + spec.names[i] + "`: out_features must be positive");
  return ok_status();
}

Result<std::unique_ptr<WeightFormat>> create_dense_weight_format(const CreateContext& ctx) {
  if (ctx.device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    return create_dense_cuda_weight_format(ctx);
#else
    return unimplemented("the `dense` weight format's CUDA half is not in this build (KILN_WITH_CUDA=OFF)");
#endif
  }
  return create_dense_cpu_weight_format(ctx);
}

}  // namespace kiln::builtin
