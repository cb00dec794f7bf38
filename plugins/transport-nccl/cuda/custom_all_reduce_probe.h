// Whether this group uses the custom all-reduce or NCCL's, decided once when the collective is created and the same
// on every rank. The probe does what the custom all-reduce will do, for real: export and open every rank's CUDA IPC
// handle, check peer access where ranks are on different GPUs (cudaDeviceCanAccessPeer alone can say yes where
// P2P is broken, as on WSL2), then run a test exchange of both kernels in fp32 and bf16 (bounded by a timeout, so
// writes that never arrive end the probe rather than hang it) and check every rank's result against the expected
// rank-order sum. Every step ends with the ranks agreeing on a verdict over the bootstrap.
#pragma once

#include <memory>
#include <string>

#include "ipc_all_reduce.h"
#include "kiln/tcp_bootstrap.h"
#include "transport_settings.h"

namespace kiln::nccl::cuda {

struct AllReduceChoice {
  std::unique_ptr<IpcAllReduce> custom;  // null: NCCL's all-reduce
  std::string reason;                    // why not the custom one (empty when it is used)
};

// mode off: NCCL without probing. auto: the probe decides; a failure is logged once (naming the rank and the
// reason) and NCCL chosen. on: a failed probe is an error. `force_probe_failure` fails the probe's check on this
// rank after the real exchange ran. Runs on the current CUDA device; every rank must call it.
Result<AllReduceChoice> choose_all_reduce(const TransportSettings& settings, TcpBootstrap& bootstrap, int device,
                                          size_t capacity = IpcAllReduce::kDefaultCapacity);

// Closes `custom`'s peer handles, waits for every rank to have done so, then frees it (how a chosen custom
// all-reduce is released; a failed barrier is logged and the memory freed anyway).
void release_custom_all_reduce(std::unique_ptr<IpcAllReduce>& custom, TcpBootstrap& bootstrap);

}  // namespace kiln::nccl::cuda
