#include "model/model_loader.h"

#include <omp.h>

#include <filesystem>

#include "kiln/launch_env.h"
#include "kiln/log.h"
#include "parallel/collective_capture.h"
#include "parallel/injected_faults.h"
#include "parallel/rank_processes.h"
#include "parallel/socket_collective.h"
#include "model/synthetic_weight_source.h"
#include "runtime/cpu_device_context.h"
#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_device_context.h"
#endif

namespace kiln {
namespace fs = std::filesystem;

bool cuda_device_available() {
#ifdef KILN_WITH_CUDA
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
#else
  return false;
#endif
}

#ifdef KILN_WITH_CUDA
// One process per rank (a torchrun-style launch of more than one rank): this rank's GPU is LOCAL_RANK modulo the
// visible devices, as torchrun and `kiln serve`'s launcher number them. More local ranks than GPUs share devices
// (round robin), which only a collective meeting through the host serves (NCCL refuses two ranks on one GPU).
Status select_rank_device() {
  auto launch = read_launch_env(process_env());
  if (!launch.ok() || launch->world_size <= 1) return ok_status();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) return unavailable("no CUDA device is visible to this rank");
  const int device = launch->local_rank % count;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return internal_error("cudaSetDevice(" + std::to_string(device) + ") for LOCAL_RANK " +
                          std::to_string(launch->local_rank) + ": " + cudaGetErrorString(e));
  log::info("rank {} (LOCAL_RANK {}) on cuda:{} of {} visible{}", launch->rank, launch->local_rank, device, count,
            launch->local_rank >= count ? " (sharing it with another rank of this machine)" : "");
  return ok_status();
}
#endif

Result<DeviceType> resolve_device(const Recipe& recipe, const Registry& registry, const Architecture& arch) {
  const RecipeSection& model = recipe.section("model");
  const std::string device = model.get_string("device", "auto");
  const std::string where = "`model.device = \"" + device + "\"` (" + model.origin("device") + ")";
  if (device == "cpu") return DeviceType::kCpu;
  // What stands between this recipe and CUDA: no GPU, the architecture's shapes, a plugin without a CUDA half.
  Status blocker = ok_status();
#ifndef KILN_WITH_CUDA
  blocker = failed_precondition("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
#endif
  if (blocker.ok() && !cuda_device_available()) blocker = unavailable("no CUDA device is visible to this process");
  if (blocker.ok()) blocker = arch.supports(DeviceType::kCuda);
  for (const auto& [section, key, kind] :
       {std::tuple{"weights", "format", PluginKind::kWeightFormat}, std::tuple{"kv", "layout", PluginKind::kKvLayout},
        std::tuple{"transport", "backend", PluginKind::kCollective}}) {
    if (!blocker.ok()) break;
    const std::string name = recipe.section(section).get_string(key, "");
    if (const CapabilityEntry* e = registry.find(kind, name)) blocker = Registry::check_device(*e, DeviceType::kCuda);
  }
  if (blocker.ok()) return DeviceType::kCuda;
  if (device == "cuda") return Status(blocker.code(), where + ": " + blocker.message());
  log::info("model.device = \"auto\": running on the CPU ({})", blocker.message());
  return DeviceType::kCpu;
}

Result<LoadedModel> load_model(const Recipe& recipe, const Registry& registry, const ModelLoadOptions& options) {
  const RecipeSection& model = recipe.section("model");
  const fs::path dir = model.get_string("path");
  if (!fs::is_directory(dir))
    return not_found("`model.path` (" + model.origin("path") + "): " + dir.string() + " is not a directory");
  LoadedModel m;
  KILN_ASSIGN_OR_RETURN(m.arch, load_architecture(dir / "config.json"));
  m.info = m.arch->info();
  m.info.checkpoint_dir = dir.string();
  KILN_ASSIGN_OR_RETURN(const DeviceType device, resolve_device(recipe, registry, *m.arch));
  const bool dummy = model.get_string("load") == "dummy";
  if (dummy && device == DeviceType::kCpu)
    return unimplemented("`model.load = \"dummy\"` (" + model.origin("load") +
                         ": random weights) is provided by the CUDA runtime; on the CPU set model.load = \"mmap\"");
  const Precision precision = model.get_string("precision", "fp32") == "bf16" ? Precision::kBf16 : Precision::kFp32;
  if (precision != Precision::kFp32 && device == DeviceType::kCuda)
    return model.error("precision", "is the CPU runner's arithmetic and has no effect on CUDA (the CUDA runner is bf16); "
                                    "remove it or run on the CPU");
  if (Status s = m.arch->supports_precision(precision); !s.ok()) return model.error("precision", s.message());
  // model.threads: the OpenMP team size of kiln's host-side kernels (the CPU forward; conversions at load).
  const int threads = static_cast<int>(model.get_int("threads", 0));
  if (threads > 0) omp_set_num_threads(threads);

  if (dummy) {
    m.synthetic = std::make_unique<SyntheticWeightSource>(1);
    m.info.synthetic_weights = true;
    m.info.weight_seed = m.synthetic->seed();
  } else {
    KILN_ASSIGN_OR_RETURN(m.checkpoint, Checkpoint::open(dir));
  }
  if (device == DeviceType::kCuda) {
#ifdef KILN_WITH_CUDA
    KILN_RETURN_IF_ERROR(select_rank_device());
    KILN_ASSIGN_OR_RETURN(auto ctx, cuda::CudaDeviceContext::create());
    m.device = std::move(ctx);
#endif
  } else {
    m.device = std::make_unique<CpuDeviceContext>();
  }

  CreateContext ctx;
  ctx.device = m.device->device();
  ctx.device_context = m.device.get();
  ctx.model = &m.info;
  ctx.section = &recipe.section("weights");
  const std::string format = recipe.section("weights").get_string("format");
  if (format != "dense") {
    // What a quantized checkpoint stores dense runs the built-in format's kernels (CreateContext::dense_weights).
    // It is made with the weights section too, which its schema adds no keys to.
    KILN_ASSIGN_OR_RETURN(m.dense_format, registry.create<WeightFormat>("dense", ctx));
    ctx.dense_weights = m.dense_format.get();
  }
  KILN_ASSIGN_OR_RETURN(m.format, registry.create<WeightFormat>(format, ctx));
  ctx.dense_weights = nullptr;
  ctx.section = &recipe.section("kv");
  KILN_ASSIGN_OR_RETURN(m.layout, registry.create<KvLayout>(recipe.section("kv").get_string("layout"), ctx));
  ctx.section = &recipe.section("transport");
  if (auto env = read_launch_env(process_env()); env.ok() && env->world_size > 1)
    KILN_RETURN_IF_ERROR(injected_load_fault(env->rank, LoadFaultPoint::kRendezvous));
  KILN_ASSIGN_OR_RETURN(m.collective,
                        registry.create<Collective>(recipe.section("transport").get_string("backend", "local"), ctx));

  // One process per rank: this rank's decode-context group (consecutive ranks g·D .. g·D + D − 1), led by its
  // first rank at that rank's own address. CUDA ranks split the KV over the whole group (D = parallel.tensor) and
  // meet through the step's collective, which already spans it (CudaMlaMoeModel::create_rank).
  LaunchEnv launch;
  const int ranks = m.collective->world_size();
  const int decode_context = static_cast<int>(recipe.section("parallel").get_int("decode_context", 1));
  if (ranks > 1) {
    KILN_ASSIGN_OR_RETURN(launch, read_launch_env(process_env()));
    m.rank = m.collective->rank();
    if (decode_context > 1 && ranks % decode_context == 0 && !m.device->device().is_cuda()) {
      auto* socket = dynamic_cast<SocketCollective*>(host_side(m.collective.get()));
      if (!socket)
        return unimplemented("parallel.decode_context = " + std::to_string(decode_context) + " with one process per rank "
                             "needs a collective per decode-context group, which only `transport.backend = \"socket\"` "
                             "makes so far");
      KILN_ASSIGN_OR_RETURN(auto addresses, socket->channel().all_gather(socket->channel().local_address()));
      const int group = m.rank / decode_context;
      RendezvousSpec spec = rendezvous_spec(launch);
      spec.addr = addresses[group * decode_context];
      spec.port = context_group_port(launch, group);
      spec.rank = m.rank % decode_context;
      spec.world_size = decode_context;
      auto context = SocketCollective::connect(spec, socket->call_timeout());  // transport.timeout_s too
      if (!context.ok())
        return context.status().with_context("decode-context group " + std::to_string(group) + " (MASTER_PORT + 2 + " +
                                             std::to_string(group) + ")");
      m.context_collective = std::move(context).value();
    }
  }

  // The control channel before the shards are built, so that a follower that cannot build its shard tells rank 0
  // why (and rank 0 does not wait for a rank that will never call back).
  std::unique_ptr<TcpBootstrap> control;
  if (ranks > 1) {
    KILN_ASSIGN_OR_RETURN(control, connect_control_channel(launch));
  }

  BuildContext build;
  build.source = &m.source();
  build.format = m.format.get();
  build.layout = m.layout.get();
  build.device = m.device.get();
  build.collective = m.collective.get();
  build.tensor_parallel = static_cast<int>(recipe.section("parallel").get_int("tensor", 1));
  build.decode_context = decode_context;
  build.context_collective = m.context_collective.get();
  m.decode_context = build.decode_context;
  build.load_mtp = options.load_mtp;
  build.precision = precision;
  build.threads = threads;
  Result<std::unique_ptr<ModelInstance>> built = [&]() -> Result<std::unique_ptr<ModelInstance>> {
    if (ranks > 1) KILN_RETURN_IF_ERROR(injected_load_fault(m.rank, LoadFaultPoint::kBuild));
    return m.arch->build(build);
  }();
  if (ranks > 1 && m.rank != 0)
    (void)report_rank_loaded(*control, built.status(), built.ok() ? (*built)->weight_bytes() : 0);
  KILN_ASSIGN_OR_RETURN(m.model, std::move(built));
  if (ranks > 1) {
    if (m.rank == 0) {
      KILN_ASSIGN_OR_RETURN(const uint64_t largest, wait_for_ranks_loaded(*control));
      const uint64_t own = m.model->weight_bytes();
      m.rank_weight_excess = largest > own ? largest - own : 0;
      // When the group breaks, ranks waiting for rank 0 in a collective are released at once.
      auto* socket = dynamic_cast<SocketCollective*>(host_side(m.collective.get()));
      std::function<void()> release;
      if (socket) release = [socket] { socket->channel().shut_down(); };
      m.model = std::make_unique<RankLeaderInstance>(std::move(m.model), std::move(control), std::move(release),
                                                     socket_call_groups(m.collective.get(), m.context_collective.get()));
      log::info("tensor-parallel rank 0 of {} processes: forwarding every call to ranks 1..{}", ranks, ranks - 1);
    } else {
      m.rank_control = std::move(control);
    }
  }
#ifdef KILN_WITH_CUDA
  if (device == DeviceType::kCuda) {
    // What loading left on the device beyond the weights (context, cuBLAS, arena slack, load-time buffers): the
    // KV pool is sized from this measurement, and the memory model (engine/memory_model.h) predicts it.
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      log::info("device memory in use after loading: {:.2f} GiB ({:.2f} GiB of it weights)",
                static_cast<double>(total_b - free_b) / (1 << 30),
                static_cast<double>(m.model->weight_bytes()) / (1 << 30));
  }
#endif
  log::info("loaded {} on {} ({} layers, hidden {}, {} experts{}) from {}", m.info.model_type, m.device->device().to_string(),
            m.info.num_layers, m.info.hidden_size, m.info.num_experts,
            m.model->weight_bytes() > 0 ? ", " + std::to_string(m.model->weight_bytes() >> 20) + " MiB of weights" : "",
            dummy ? "dummy weights" : dir.string());
  return m;
}

}  // namespace kiln
