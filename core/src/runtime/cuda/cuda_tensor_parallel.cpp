// The tensor-parallel meetings of a CUDA step (cuda_model_step.h): gathers that copy each unit from its owner, and
// sums in which every element has at most one non-zero contributor. Neither changes a value, so a rank's step
// computes what one rank computes wherever its kernels do (see CudaMlaMoeModel::create_rank).
#include "runtime/cuda/cuda_model_step.h"

namespace kiln::cuda {

size_t gather_staging_bytes(const TensorShard& shard, int64_t n, int64_t units, int64_t width, DType dtype) {
  return static_cast<size_t>(n * shard.max_count(units) * width) * dtype_size(dtype);
}

Status gather_units(const StepContext& x, const void* local, int64_t n, int64_t units, int64_t width, DType dtype,
                    void* full) {
  const TensorShard& shard = x.I.shard;
  const size_t es = dtype_size(dtype);
  const size_t block = static_cast<size_t>(shard.max_count(units) * width) * es;  // one row of one rank's block
  const size_t mine = static_cast<size_t>(shard.count(units) * width) * es;
  const size_t row = static_cast<size_t>(units * width) * es;
  if (n == 0) return ok_status();
  const cudaStream_t st = x.I.stream;
  // Pad bytes of a short part are sent as they are: nobody reads them back.
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(x.b.gather_send, block, local, mine, mine, n, cudaMemcpyDeviceToDevice, st),
                               "tensor-parallel gather (pack)"));
  KILN_RETURN_IF_ERROR(x.I.collective
                           ->all_gather(x.b.gather_send, x.b.gather_recv, static_cast<int64_t>(n * block / es), dtype,
                                        x.I.sdk_stream())
                           .with_context("tensor-parallel gather"));
  for (int r = 0; r < shard.world; ++r) {
    const TensorShard other{r, shard.world};
    const size_t bytes = static_cast<size_t>(other.count(units) * width) * es;
    const size_t offset = static_cast<size_t>(other.begin(units) * width) * es;
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpy2DAsync(static_cast<char*>(full) + offset, row,
                                                   x.b.gather_recv + static_cast<size_t>(r) * n * block, block, bytes,
                                                   n, cudaMemcpyDeviceToDevice, st),
                                 "tensor-parallel gather (unpack)"));
  }
  return ok_status();
}

Status sum_exclusive(const StepContext& x, void* y, int64_t count, DType dtype) {
  return x.I.collective->all_reduce(y, count, dtype, ReduceOp::kSum, x.I.sdk_stream()).with_context("tensor-parallel sum");
}

}  // namespace kiln::cuda
