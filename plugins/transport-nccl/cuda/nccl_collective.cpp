#include "nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_watchdog.h"
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

// A non-blocking communicator as the watchdog sees it. `mu` keeps an enqueue and the watchdog's abort apart (NCCL
// allows ncclCommAbort from another thread, not racing a call on the same communicator); after the abort `comm` is
// null and nothing touches it again.
struct NcclComm final : WatchedComm {
  explicit NcclComm(ncclComm_t c) : comm(c) {}
  Health health(std::string& error) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!comm) {
      error = "aborted";
      return Health::kError;
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return Health::kOk;
    if (state == ncclInProgress) return Health::kInProgress;
    error = ncclGetErrorString(state);
    if (const char* last = ncclGetLastError(comm); last && *last) error += ": " + std::string(last);
    return Health::kError;
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mu);
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  std::mutex mu;
  ncclComm_t comm;
};

WatchClock::time_point clock_now() { return WatchClock::now(); }
void sleep_for(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

class NcclCollective final : public Collective {
 public:
  NcclCollective(int device, std::unique_ptr<TcpBootstrap> bootstrap, std::unique_ptr<NcclComm> comm,
                 std::unique_ptr<CommWatchdog> watchdog, std::unique_ptr<IpcAllReduce> custom)
      : device_(device),
        bootstrap_(std::move(bootstrap)),
        comm_(std::move(comm)),
        watchdog_(std::move(watchdog)),
        custom_(std::move(custom)),
        // Ticks often enough that an abort follows the bound closely, rarely enough to cost nothing.
        thread_(std::make_unique<WatchdogThread>(
            *watchdog_, std::chrono::milliseconds(std::clamp<int64_t>(watchdog_->timeout().count() / 20, 5, 100)))) {}

  ~NcclCollective() override {
    thread_.reset();  // no tick from here on
    cudaSetDevice(device_);
    if (!watchdog_->aborted()) {
      release_custom_all_reduce(custom_, *bootstrap_);
      finalize();
    }
    {
      std::lock_guard<std::mutex> lock(comm_->mu);
      if (comm_->comm) ncclCommDestroy(comm_->comm);  // null once aborted: ncclCommAbort freed it
      comm_->comm = nullptr;
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  int rank() const override { return bootstrap_->rank(); }
  int world_size() const override { return bootstrap_->world_size(); }

  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "all_reduce"));
    if (count == 0) return ok_status();
    KILN_RETURN_IF_ERROR(watchdog_->status());
    if (custom_ && custom_->takes(buffer, count, dtype, op)) return custom_->all_reduce(buffer, count, dtype, s);
    KILN_ASSIGN_OR_RETURN(ncclDataType_t type, reduction_type(dtype));
    return enqueue("ncclAllReduce", count, dtype, s, [&](ncclComm_t c) {
      return ncclAllReduce(buffer, buffer, static_cast<size_t>(count), type, nccl_op(op), c, s);
    });
  }

  // Only the custom all-reduce fuses; NCCL's sum leaves the combine to the caller's kernel.
  Result<bool> all_reduce_moe_combine_norm(const MoeCombineNorm& run, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(run.n, stream, "all_reduce_moe_combine_norm"));
    if (!custom_ || !custom_->takes(run)) return false;
    KILN_RETURN_IF_ERROR(watchdog_->status());
    KILN_RETURN_IF_ERROR(custom_->moe_combine_norm(run, s));
    return true;
  }
  // Data movement is typeless: bytes, so every dtype (int16 included) moves.
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "all_gather"));
    if (count == 0) return ok_status();
    return enqueue("ncclAllGather", count, dtype, s,
                   [&](ncclComm_t c) { return ncclAllGather(in, out, bytes(count, dtype), ncclUint8, c, s); });
  }

  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "reduce_scatter"));
    if (count == 0) return ok_status();
    KILN_ASSIGN_OR_RETURN(ncclDataType_t type, reduction_type(dtype));
    return enqueue("ncclReduceScatter", count, dtype, s, [&](ncclComm_t c) {
      return ncclReduceScatter(in, out, static_cast<size_t>(count), type, nccl_op(op), c, s);
    });
  }

  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override {
    KILN_ASSIGN_OR_RETURN(cudaStream_t s, check(count, stream, "broadcast"));
    if (root < 0 || root >= world_size())
      return out_of_range("collective nccl: broadcast root " + std::to_string(root) + " of world size " +
                          std::to_string(world_size()));
    if (count == 0) return ok_status();
    return enqueue("ncclBroadcast", count, dtype, s, [&](ncclComm_t c) {
      return ncclBroadcast(buffer, buffer, bytes(count, dtype), ncclUint8, root, c, s);
    });
  }

 private:
  // A clean shutdown: ncclCommFinalize flushes what the communicator still has in flight and releases its network
  // resources in step with the peers, so the ncclCommDestroy that follows only frees memory (destroying an
  // unfinalized communicator does that flush inside Destroy, unbounded). Non-blocking, it is polled under
  // transport.timeout_s like any call: a peer that is gone leaves it in progress, and the watchdog then aborts the
  // communicator (the broken path) instead.
  void finalize() {
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(comm_->mu);
      if (!comm_->comm) return;
      r = ncclCommFinalize(comm_->comm);
    }
    Status done = r == ncclSuccess || r == ncclInProgress
                      ? watchdog_->wait_ready("ncclCommFinalize", clock_now, sleep_for)
                      : nccl_status(r, "ncclCommFinalize", comm_->comm);
    if (done.ok()) return;
    log::warn("{}", done.message());
    comm_->abort();  // no-op when the watchdog already did
  }
  static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

  Result<cudaStream_t> check(int64_t count, Stream stream, const char* what) const {
    if (count < 0) return invalid_argument(std::string("collective nccl: ") + what + " of a negative count");
    if (!stream.device.is_cuda() || stream.device.index != device_)
      return failed_precondition(std::string("collective nccl: ") + what + " on " + stream.device.to_string() +
                                 ", but this rank's communicator is on cuda:" + std::to_string(device_));
    return static_cast<cudaStream_t>(stream.handle);
  }

  // One NCCL call under the communicator's lock, then — outside it, since the watchdog aborts under that lock too —
  // a wait while NCCL is still enqueuing (ncclInProgress, e.g. connecting peers), and the call's completion handed
  // to the watchdog. An aborted communicator fails every call with the watchdog's reason.
  template <class Call>
  Status enqueue(const char* name, int64_t count, DType dtype, cudaStream_t s, Call&& call) {
    KILN_RETURN_IF_ERROR(watchdog_->status());
    const std::string what = std::string(name) + " of " + std::to_string(count) + " " + dtype_name(dtype);
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(comm_->mu);
      if (!comm_->comm) return watchdog_->status();
      r = call(comm_->comm);
    }
    if (r == ncclInProgress) {
      KILN_RETURN_IF_ERROR(watchdog_->wait_ready(what, clock_now, sleep_for));
    } else if (r != ncclSuccess) {
      return nccl_status(r, what);
    }
    watch(what, s);
    return ok_status();
  }

  // Hands the call's completion (an event recorded after it) to the watchdog. Not inside a CUDA graph capture: an
  // event recorded there is a node of the graph, completed by its replays, which the watchdog cannot see — a
  // captured step is guarded by the asynchronous-error check only (README, "Hung ranks").
  void watch(const std::string& what, cudaStream_t s) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return;
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (!free_events_.empty()) {
        ev = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (!ev) {
      if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return;
      std::lock_guard<std::mutex> lock(events_mu_);
      events_.push_back(ev);
    }
    if (cudaEventRecord(ev, s) != cudaSuccess) return;
    watchdog_->begin(
        what, WatchClock::now(), [ev] { return cudaEventQuery(ev) != cudaErrorNotReady; },
        [this, ev] {
          std::lock_guard<std::mutex> lock(events_mu_);
          free_events_.push_back(ev);
        });
  }

  int device_;
  std::unique_ptr<TcpBootstrap> bootstrap_;  // kept for releasing the custom all-reduce in step with the peers
  std::unique_ptr<NcclComm> comm_;
  std::unique_ptr<CommWatchdog> watchdog_;
  std::unique_ptr<IpcAllReduce> custom_;
  std::mutex events_mu_;
  std::vector<cudaEvent_t> events_, free_events_;  // every event made; those not pending
  std::unique_ptr<WatchdogThread> thread_;
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

  // Non-blocking (blocking = 0): creation returns at once and is polled, so a rank that never arrives ends it
  // after transport.timeout_s with an error instead of a hang; the watchdog then guards every call.
  ncclComm_t raw = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string init = "ncclCommInitRankConfig (rank " + std::to_string(launch.rank) + " of " +
                           std::to_string(launch.world_size) + " on cuda:" + std::to_string(device) + ")";
  const ncclResult_t started = ncclCommInitRankConfig(&raw, launch.world_size, id, launch.rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (raw) ncclCommAbort(raw);
    return nccl_status(started, init);
  }
  auto comm = std::make_unique<NcclComm>(raw);
  auto watchdog = std::make_unique<CommWatchdog>(*comm, settings.timeout);
  KILN_RETURN_IF_ERROR(watchdog->wait_ready(init, clock_now, sleep_for));
  auto choice = choose_all_reduce(settings, *bootstrap, device);
  if (!choice.ok()) {
    comm->abort();  // the broken path: a peer may be gone, and an abort waits for none
    return choice.status();
  }
  int version = 0;
  ncclGetVersion(&version);
  log::info("collective nccl: rank {} of {} on cuda:{} (NCCL {}), all-reduce by {} (custom_all_reduce = {}); "
            "non-blocking communicator, aborted by its watchdog on an error or a call pending over {}",
            launch.rank, launch.world_size, device, version,
            choice->custom ? "the custom CUDA-IPC kernels where they apply" : "NCCL",
            mode_name(settings.custom_all_reduce), bound_text(settings.timeout));
  return std::unique_ptr<Collective>(new NcclCollective(device, std::move(bootstrap), std::move(comm),
                                                        std::move(watchdog), std::move(choice->custom)));
}

}  // namespace kiln::nccl::cuda
