#include "runtime/cuda/host_staged_collective.h"

#include <cuda_runtime.h>

#include "runtime/cuda/cuda_device_context.h"

namespace kiln::cuda {
namespace {

const Stream kHost{Device::cpu(), nullptr};

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(what + ": " + cudaGetErrorString(e));
}

}  // namespace

std::string HostStagedCollective::why_not_capturable() const {
  return "its ranks meet through host memory (stream synchronisation and copies in every call)";
}

Status HostStagedCollective::to_host(const void* src, size_t bytes, const Stream& stream, const char* what) {
  const std::string where = std::string("collective over the host (") + what + ")";
  if (!stream.device.is_cuda())
    return failed_precondition(where + ": expects device buffers on a CUDA stream, got " + stream.device.to_string());
  const cudaStream_t st = cuda_stream_of(stream);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  KILN_RETURN_IF_ERROR(cuda_status(cudaStreamIsCapturing(st, &capturing), where));
  if (capturing != cudaStreamCaptureStatusNone)
    return failed_precondition(where + " inside a CUDA graph capture: " + why_not_capturable());
  // The pinned buffers are only refilled once the stream has drained (every call ends synchronised too).
  KILN_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(st), where));
  KILN_RETURN_IF_ERROR(in_.ensure(bytes));
  if (bytes == 0) return ok_status();
  KILN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(in_.data(), src, bytes, cudaMemcpyDeviceToHost, st), where));
  return cuda_status(cudaStreamSynchronize(st), where);
}

Status HostStagedCollective::to_device(void* dst, const char* host, size_t bytes, const Stream& stream, const char* what) {
  if (bytes == 0) return ok_status();
  const std::string where = std::string("collective over the host (") + what + ")";
  const cudaStream_t st = cuda_stream_of(stream);
  KILN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, st), where));
  return cuda_status(cudaStreamSynchronize(st), where);
}

Status HostStagedCollective::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  KILN_RETURN_IF_ERROR(to_host(buffer, bytes, stream, "all_reduce"));
  KILN_RETURN_IF_ERROR(host_->all_reduce(in_.data(), count, dtype, op, kHost));
  return to_device(buffer, in_.data(), bytes, stream, "all_reduce");
}

Status HostStagedCollective::all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  KILN_RETURN_IF_ERROR(to_host(in, bytes, stream, "all_gather"));
  KILN_RETURN_IF_ERROR(out_.ensure(bytes * static_cast<size_t>(world_size())));
  KILN_RETURN_IF_ERROR(host_->all_gather(in_.data(), out_.data(), count, dtype, kHost));
  return to_device(out, out_.data(), bytes * static_cast<size_t>(world_size()), stream, "all_gather");
}

Status HostStagedCollective::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                                            Stream stream) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  KILN_RETURN_IF_ERROR(to_host(in, bytes * static_cast<size_t>(world_size()), stream, "reduce_scatter"));
  KILN_RETURN_IF_ERROR(out_.ensure(bytes));
  KILN_RETURN_IF_ERROR(host_->reduce_scatter(in_.data(), out_.data(), count, dtype, op, kHost));
  return to_device(out, out_.data(), bytes, stream, "reduce_scatter");
}

Status HostStagedCollective::broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  KILN_RETURN_IF_ERROR(to_host(buffer, bytes, stream, "broadcast"));
  KILN_RETURN_IF_ERROR(host_->broadcast(in_.data(), count, dtype, root, kHost));
  return to_device(buffer, in_.data(), bytes, stream, "broadcast");
}

}  // namespace kiln::cuda
