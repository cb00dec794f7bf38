#include "nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "custom_all_reduce_probe.h"
#include "kiln/log.h"
#include "kiln/launch_env.h"
#include "nccl_env_settings.h"
#include "kiln/tcp_bootstrap.h"
#include "transport_settings.h"

namespace kiln::nccl::cuda {
namespace {

Status nccl_status(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return ok_status();
  std::string msg = "collective nccl: " + what + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) msg += " (" + std::string(last) + ")";
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? invalid_argument(msg) : unavailable(msg);
}

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ok_status();
  return unavailable("collective nccl: " + what + ": " + cudaGetErrorString(e));
}

// The element type of a reduction; the types NCCL cannot reduce are refused by name.
Result<ncclDataType_t> reduction_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI8:
      return ncclInt8;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DType::kF8E4M3:
      return ncclFloat8e4m3;
#endif
    default:
      break;
  }
  return unimplemented(std::string("collective nccl: NCCL cannot reduce ") + dtype_name(dtype) + " elements");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kMax ? ncclMax : ncclSum;
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(int device, std::unique_ptr<TcpBootstrap> bootstrap, ncclComm_t comm,
                 std::unique_ptr<IpcAllReduce> custom)
      : device_(device), bootstrap_(std::move(bootstrap)), comm_(comm), custom_(std::move(custom)) {}

  ~NcclCollective() override {
    cudaSetDevice(device_);
    release_custom_all_reduce(custom_, *bootstrap_);
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return bootstrap_->rank(); }
  int world_size() const override { return bootstrap_->world_size(); }

  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "all_reduce"));
    if (count == 0) return ok_status();
    if (custom_ && custom_->takes(buffer, count, dtype, op)) return custom_->all_reduce(buffer, count, dtype, s);
    KILN_ASSIGN_OR_RETURN(ncclDataType_t type, reduction_type(dtype));
    return nccl_status(ncclAllReduce(buffer, buffer, static_cast<size_t>(count), type, nccl_op(op), comm_, s),
                       "ncclAllReduce", comm_);
  }

  // Data movement is typeless: bytes, so every dtype (int16 included) moves.
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "all_gather"));
    if (count == 0) return ok_status();
    return nccl_status(ncclAllGather(in, out, bytes(count, dtype), ncclUint8, comm_, s), "ncclAllGather", comm_);
  }

  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "reduce_scatter"));
    if (count == 0) return ok_status();
    KILN_ASSIGN_OR_RETURN(ncclDataType_t type, reduction_type(dtype));
    return nccl_status(ncclReduceScatter(in, out, static_cast<size_t>(count), type, nccl_op(op), comm_, s),
                       "ncclReduceScatter", comm_);
  }

  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "broadcast"));
    if (root < 0 || root >= world_size())
      return out_of_range("collective nccl: broadcast root " + std::to_string(root) + " of world size " +
                          std::to_string(world_size()));
    if (count == 0) return ok_status();
    return nccl_status(ncclBroadcast(buffer, buffer, bytes(count, dtype), ncclUint8, root, comm_, s), "ncclBroadcast",
                       comm_);
  }

 private:
  static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

  Result<cudaStream_t> check(int64_t count, Stream stream, const char* what) const {
    if (count < 0) return invalid_argument(std::string("collective nccl: ") + what + " of a negative count");
    if (!stream.device.is_cuda() || stream.device.index != device_)
      return failed_precondition(std::string("collective nccl: ") + what + " on " + stream.device.to_string() +
                                 ", but this rank's communicator is on cuda:" + std::to_string(device_));
    return static_cast<cudaStream_t>(stream.handle);
  }

  int device_;
  std::unique_ptr<TcpBootstrap> bootstrap_;  // kept for releasing the custom all-reduce in step with the peers
  ncclComm_t comm_;
  std::unique_ptr<IpcAllReduce> custom_;
};

}  // namespace

Result<std::unique_ptr<Collective>> create_nccl_collective(const CreateContext& ctx) {
  if (!ctx.device.is_cuda())
    return unimplemented("the collective `nccl` runs between CUDA devices; on " + ctx.device.to_string() +
                         " use transport.backend = \"local\"");
  KILN_ASSIGN_OR_RETURN(const TransportSettings settings, read_transport_settings(ctx.section));
  // Before any NCCL call: NCCL reads its environment once, at its first use in the process.
  KILN_RETURN_IF_ERROR(apply_nccl_env(settings.env));
  KILN_ASSIGN_OR_RETURN(const LaunchEnv launch, read_launch_env(process_env()));
  const int device = ctx.device.index;
  KILN_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));

  KILN_ASSIGN_OR_RETURN(auto bootstrap, TcpBootstrap::connect(rendezvous_spec(launch)));

  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  std::string id_bytes;
  if (launch.rank == 0) {
    KILN_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    id_bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  KILN_ASSIGN_OR_RETURN(id_bytes, bootstrap->broadcast(id_bytes));
  if (id_bytes.size() != sizeof id)
    return data_loss("collective nccl: rank 0 sent a " + std::to_string(id_bytes.size()) + "-byte NCCL unique id");
  std::memcpy(&id, id_bytes.data(), sizeof id);

  ncclComm_t comm = nullptr;
  KILN_RETURN_IF_ERROR(nccl_status(ncclCommInitRank(&comm, launch.world_size, id, launch.rank),
                                   "ncclCommInitRank (rank " + std::to_string(launch.rank) + " of " +
                                       std::to_string(launch.world_size) + " on cuda:" + std::to_string(device) + ")"));
  auto choice = choose_all_reduce(settings, *bootstrap, device);
  if (!choice.ok()) {
    ncclCommDestroy(comm);
    return choice.status();
  }
  int version = 0;
  ncclGetVersion(&version);
  log::info("collective nccl: rank {} of {} on cuda:{} (NCCL {}), all-reduce by {} (custom_all_reduce = {})",
            launch.rank, launch.world_size, device, version,
            choice->custom ? "the custom CUDA-IPC kernels where they apply" : "NCCL",
            mode_name(settings.custom_all_reduce));
  return std::unique_ptr<Collective>(new NcclCollective(device, std::move(bootstrap), comm, std::move(choice->custom)));
}

}  // namespace kiln::nccl::cuda
