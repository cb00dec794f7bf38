// The tensor-parallel meetings of a CUDA step (cuda_model_step.h): gathers that copy each unit from its owner, and
// sums in which every element has at most one non-zero contributor. Neither changes a value, so a rank's step
// computes what one rank computes wherever its kernels do (see CudaMlaMoeModel::create_rank).
#include "runtime/cuda/cuda_model_step.h"

#include "kernels/cuda/embedding.h"
#include "runtime/cuda/model_glue_kernels.h"

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

Status rank_embedding_rows(CudaMlaMoeModel::Impl& I, const ModelConfig& c, const uint16_t* table, const int32_t* ids,
                           int64_t n, int32_t* local_ids, uint16_t* out) {
  if (n == 0) return ok_status();
  const int64_t Hd = c.hidden_size;
  KILN_RETURN_IF_ERROR(offset_ids_i32(ids, n, static_cast<int32_t>(I.shard.begin(c.vocab_size)), local_ids, I.s()));
  KILN_RETURN_IF_ERROR(embedding_gather_bf16(table, I.shard.count(c.vocab_size), Hd, local_ids, n, out, I.s()));
  return I.collective->all_reduce(out, n * Hd, DType::kBF16, ReduceOp::kSum, I.sdk_stream())
      .with_context("tensor-parallel embedding");
}

namespace {
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
}  // namespace

size_t rank_head_scratch_bytes(const TensorShard& shard, int64_t n, int64_t vocab) {
  const size_t local = static_cast<size_t>(n * shard.count(vocab)) * sizeof(float);
  const size_t send = gather_staging_bytes(shard, n, vocab, 1, DType::kF32);
  return align256(local) + align256(send) + send * static_cast<size_t>(shard.world);
}

Status rank_head_logits(CudaMlaMoeModel::Impl& I, const ModelConfig& c, const Linear& head, const TensorView& hidden,
                        char* scratch, float* logits) {
  const int64_t n = hidden.numel() / c.hidden_size, V = c.vocab_size, mine = I.shard.count(V);
  if (n == 0) return ok_status();
  const size_t local_bytes = static_cast<size_t>(n * mine) * sizeof(float);
  const size_t send_bytes = gather_staging_bytes(I.shard, n, V, 1, DType::kF32);
  auto* local = reinterpret_cast<float*>(scratch);
  LinearRun r;
  r.x = hidden;
  r.y = TensorView::contiguous(local, DType::kF32, {n, mine}, I.dev.device());
  KILN_RETURN_IF_ERROR(head.run(r, I.dev.stream()));
  StepShape shape;
  shape.shard = I.shard;
  StepBuffers b{};
  b.gather_send = scratch + align256(local_bytes);
  b.gather_recv = b.gather_send + align256(send_bytes);
  const StepContext x{c, I, shape, b, 0, {}, nullptr};
  return gather_units(x, local, n, V, 1, DType::kF32, logits).with_context("tensor-parallel lm_head (drafter)");
}

}  // namespace kiln::cuda
