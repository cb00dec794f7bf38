#include "custom_all_reduce_probe.h"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "kiln/log.h"
#include "probe_pattern.h"

namespace kiln::nccl::cuda {
namespace {

constexpr uint64_t kProbeTimeoutNs = uint64_t{10} * 1000 * 1000 * 1000;  // time-sliced ranks on one GPU need a while
constexpr int64_t kProbeBytes = 96 * 1024 + 48;  // several blocks, slices not a multiple of the block width

std::string cuda_text(cudaError_t e) {
  return cudaGetErrorString(e);
}

// Every rank's verdict ("" = passed); the first failure as "rank r: why", or "" when all passed.
Result<std::string> agree(TcpBootstrap& bootstrap, const std::string& mine) {
  KILN_ASSIGN_OR_RETURN(auto all, bootstrap.all_gather(mine));
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) return "rank " + std::to_string(r) + ": " + all[r];
  return std::string();
}

// Peer access from this process's GPU to every other rank's, where they differ.
std::string check_peer_access(TcpBootstrap& bootstrap, int device, const std::vector<std::string>& bus_ids) {
  const std::string& mine = bus_ids[bootstrap.rank()];
  for (int r = 0; r < bootstrap.world_size(); ++r) {
    if (r == bootstrap.rank() || bus_ids[r] == mine) continue;
    int peer_device = -1;
    // Not visible here (CUDA_VISIBLE_DEVICES): opening the handle is the test.
    if (cudaDeviceGetByPCIBusId(&peer_device, bus_ids[r].c_str()) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer_device) != cudaSuccess || !can)
      return "no peer access from GPU " + mine + " to rank " + std::to_string(r) + "'s GPU " + bus_ids[r];
  }
  return "";
}

// Runs both kernels on both element types and compares with the host's rank-order sum; "" when all match.
std::string test_exchange(IpcAllReduce& ar) {
  const int rank = ar.rank(), world = ar.world_size();
  char* buffer = nullptr;
  uint32_t* timed_out = nullptr;
  cudaStream_t stream = nullptr;
  std::string failure;
  auto fail = [&](const std::string& why) {
    if (failure.empty()) failure = why;
  };
  if (cudaMalloc(&buffer, kProbeBytes) != cudaSuccess || cudaMalloc(&timed_out, sizeof(uint32_t)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    fail("allocating the probe's buffers: " + cuda_text(cudaGetLastError()));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto algorithm : {IpcAllReduce::Algorithm::kOneShot, IpcAllReduce::Algorithm::kTwoShot}) {
      if (!failure.empty()) break;
      const int64_t count = kProbeBytes / static_cast<int64_t>(dtype_size(dtype));
      const std::vector<char> input = probe_input(dtype, rank, count);
      const std::vector<char> expected = probe_expected_sum(dtype, world, count);
      std::vector<char> got(kProbeBytes);
      // On the probe's stream: a non-blocking stream does not wait for the legacy stream's copies, and a pageable
      // cudaMemcpy may return before its DMA lands.
      cudaMemcpyAsync(buffer, input.data(), kProbeBytes, cudaMemcpyHostToDevice, stream);
      cudaMemsetAsync(timed_out, 0, sizeof(uint32_t), stream);
      Status s = ar.all_reduce(buffer, count, dtype, stream, algorithm, kProbeTimeoutNs, timed_out);
      if (!s.ok()) {
        fail(s.message());
        break;
      }
      const cudaError_t e = cudaStreamSynchronize(stream);
      uint32_t late = 0;
      if (e == cudaSuccess) cudaMemcpy(&late, timed_out, sizeof late, cudaMemcpyDeviceToHost);
      if (e == cudaSuccess) cudaMemcpy(got.data(), buffer, kProbeBytes, cudaMemcpyDeviceToHost);
      const char* name = algorithm == IpcAllReduce::Algorithm::kOneShot ? "one-shot" : "two-shot";
      if (e != cudaSuccess)
        fail(std::string("the ") + name + " test exchange failed: " + cuda_text(e));
      else if (late)
        fail(std::string("the ") + name +
             " test exchange timed out waiting for a peer's flags (no "
             "working peer writes?)");
      else if (std::memcmp(got.data(), expected.data(), kProbeBytes) != 0)
        fail(std::string("the ") + name + " test exchange in " + dtype_name(dtype) +
             " gave a wrong sum (peer memory not coherent?)");
    }
  }
  if (stream) cudaStreamDestroy(stream);
  cudaFree(buffer);
  cudaFree(timed_out);
  return failure;
}

}  // namespace

void release_custom_all_reduce(std::unique_ptr<IpcAllReduce>& custom, TcpBootstrap& bootstrap) {
  if (!custom) return;
  custom->close_peers();
  if (Status s = bootstrap.barrier(); !s.ok())
    log::warn("custom all-reduce: waiting for the peers to close their IPC handles: {}", s.message());
  custom.reset();
}

Result<AllReduceChoice> choose_all_reduce(const TransportSettings& settings, TcpBootstrap& bootstrap, int device,
                                          size_t capacity) {
  AllReduceChoice choice;
  if (settings.custom_all_reduce == CustomAllReduceMode::kOff) {
    choice.reason = "transport.custom_all_reduce = off";
    log::info("collective nccl: all-reduce by NCCL ({})", choice.reason);
    return choice;
  }
  const int rank = bootstrap.rank(), world = bootstrap.world_size();

  // 1. This rank's area and handle, and its GPU's PCI bus id.
  std::string local_failure, handle;
  char bus_id[32] = {0};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess)
    local_failure = "cudaDeviceGetPCIBusId: " + cuda_text(cudaGetLastError());
  std::unique_ptr<IpcAllReduce> ar;
  if (local_failure.empty()) {
    auto made = IpcAllReduce::create(rank, world, capacity);
    if (!made.ok())
      local_failure = made.status().message();
    else
      ar = std::move(*made);
  }
  if (ar) {
    auto h = ar->export_handle();
    if (!h.ok())
      local_failure = h.status().message();
    else
      handle = *h;
  }
  // Blob: verdict byte, bus id, newline, then the handle (or the reason).
  const std::string blob = (local_failure.empty() ? "1" : "0") + std::string(bus_id) + "\n" +
                           (local_failure.empty() ? handle : local_failure);
  KILN_ASSIGN_OR_RETURN(auto blobs, bootstrap.all_gather(blob));
  std::string reason;
  std::vector<std::string> bus_ids(world), handles(world);
  for (int r = 0; r < world && reason.empty(); ++r) {
    const size_t nl = blobs[r].find('\n');
    if (blobs[r].empty() || nl == std::string::npos) {
      reason = "rank " + std::to_string(r) + " sent a malformed probe message";
      break;
    }
    bus_ids[r] = blobs[r].substr(1, nl - 1);
    if (blobs[r][0] != '1')
      reason = "rank " + std::to_string(r) + ": " + blobs[r].substr(nl + 1);
    else
      handles[r] = blobs[r].substr(nl + 1);
  }

  // 2. Peer access and opening the handles.
  if (reason.empty()) {
    std::string opened = check_peer_access(bootstrap, device, bus_ids);
    if (opened.empty())
      if (Status s = ar->open_peers(handles); !s.ok()) opened = s.message();
    KILN_ASSIGN_OR_RETURN(reason, agree(bootstrap, opened));
  }

  // 3. The test exchange, on every rank once all could open every handle.
  if (reason.empty()) {
    std::string tested = test_exchange(*ar);
    if (tested.empty() && settings.force_probe_failure)
      tested = "the probe was made to fail (transport.custom_all_reduce_force_fail = true)";
    KILN_ASSIGN_OR_RETURN(reason, agree(bootstrap, tested));
  }

  if (reason.empty()) {
    log::info("collective nccl: custom all-reduce over CUDA IPC ({} ranks, up to {} bytes a call; NCCL above)", world,
              capacity);
    choice.custom = std::move(ar);
    return choice;
  }
  // Every rank takes part in this barrier, with or without an area of its own, so the bootstrap stays in step.
  if (ar) ar->close_peers();
  if (Status s = bootstrap.barrier(); !s.ok())
    log::warn("custom all-reduce: waiting for the peers to close their IPC handles: {}", s.message());
  ar.reset();
  if (settings.custom_all_reduce == CustomAllReduceMode::kOn)
    return failed_precondition("transport.custom_all_reduce = on, but the custom all-reduce probe failed: " + reason);
  log::warn("collective nccl: custom all-reduce probe failed, all-reduce by NCCL: {}", reason);
  choice.reason = reason;
  return choice;
}

}  // namespace kiln::nccl::cuda
