#include "model/model_loader.h"

#include <filesystem>

#include "kiln/log.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/cuda_mla_moe_model.h"
#endif

namespace kiln {
namespace fs = std::filesystem;

Result<LoadedModel> load_model(const Recipe& recipe, const Registry& registry, const ModelLoadOptions& options) {
  const RecipeSection& model = recipe.section("model");
  const fs::path dir = model.get_string("path");
  const RecipeSection& parallel = recipe.section("parallel");
  for (const char* key : {"tensor", "decode_context"})
    if (parallel.get_int(key, 1) > 1)
      return parallel.error(key, "multi-GPU parallelism is not implemented yet; this kiln runs one rank (set it to 1)");
  if (!fs::is_directory(dir))
    return not_found("`model.path` (" + model.origin("path") + "): " + dir.string() + " is not a directory");
  const bool dummy = model.get_string("load") == "dummy";
  const std::string device = model.get_string("device", "auto");
#ifdef KILN_WITH_CUDA
  bool on_gpu = device == "cuda" || (device == "auto" && cuda::CudaMlaMoeModel::device_available());
#else
  if (device == "cuda")
    return failed_precondition("`model.device = \"cuda\"` (" + model.origin("device") +
                               "): this kiln was built without CUDA (KILN_WITH_CUDA=OFF)");
  const bool on_gpu = false;
#endif
  if (dummy && !on_gpu)
    return unimplemented("`model.load = \"dummy\"` (random weights) is provided by the CUDA runtime; on the CPU set "
                         "model.load = \"mmap\"");

  LoadedModel m;
  KILN_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::load(dir / "config.json"));
  if (!dummy) {
    KILN_ASSIGN_OR_RETURN(m.checkpoint, Checkpoint::open(dir));
  }
#ifdef KILN_WITH_CUDA
  if (on_gpu) {
    // What the CUDA runner does not run yet: with device = "auto" that means the CPU, with "cuda" an error.
    Status blocker = cuda::CudaMlaMoeModel::supports(config);
    if (blocker.ok() && recipe.section("kv").get_string("layout") != "bf16")
      blocker = unimplemented("the CUDA runner keeps KV in the built-in `bf16` layout; set kv.layout = \"bf16\" (" +
                              recipe.section("kv").origin("layout") + ")");
    if (!blocker.ok()) {
      if (device == "cuda" || dummy) return blocker;
      log::info("model.device = \"auto\": running on the CPU ({})", blocker.message());
      on_gpu = false;
    }
  }
#endif
  m.info = config.to_model_info();

  CreateContext ctx;
  ctx.device = Device::cpu();
  ctx.model = &m.info;
  ctx.section = &recipe.section("weights");
  KILN_ASSIGN_OR_RETURN(m.format, registry.create<WeightFormat>(recipe.section("weights").get_string("format"), ctx));
  ctx.section = &recipe.section("kv");
  KILN_ASSIGN_OR_RETURN(m.layout, registry.create<KvLayout>(recipe.section("kv").get_string("layout"), ctx));
  KvGeometry g = m.layout->geometry();
  if (g.latent_dim != config.kv_lora_rank || g.rope_dim != config.qk_rope_head_dim)
    return failed_precondition("kv layout `" + recipe.section("kv").get_string("layout") + "` has geometry " +
                               std::to_string(g.latent_dim) + "+" + std::to_string(g.rope_dim) + ", the model needs " +
                               std::to_string(config.kv_lora_rank) + "+" + std::to_string(config.qk_rope_head_dim));

#ifdef KILN_WITH_CUDA
  if (on_gpu) {
    KILN_ASSIGN_OR_RETURN(m.gpu, cuda::CudaMlaMoeModel::create(config, m.checkpoint.get(), 1, options.load_mtp));
    log::info("{} on the GPU: {:.2f} GiB of bf16 weights ({})", config.model_type,
              static_cast<double>(m.gpu->weight_bytes()) / (1 << 30), dummy ? "dummy, random" : dir.string());
  }
#endif
  ModelWeights weights;
  if (!dummy) {
    // model.precision (the schema allows fp32 and bf16 only): the CPU runner's arithmetic; the CUDA runner is bf16.
    const Precision precision = model.get_string("precision", "fp32") == "bf16" ? Precision::kBf16 : Precision::kFp32;
    KILN_ASSIGN_OR_RETURN(weights, load_model_weights(config, *m.checkpoint, *m.format, options.load_mtp, precision));
  }
  bool has_mtp = !weights.mtp.empty();
#ifdef KILN_WITH_CUDA
  if (m.gpu) has_mtp = m.gpu->num_mtp_layers() > 0;
#endif
  if (options.load_mtp && !has_mtp)
    return not_found(dir.string() + " has no MTP weights (model.layers." + std::to_string(config.num_hidden_layers) +
                     ".eh_proj.weight); choose a checkpoint with its next-n layer or set speculative.method = \"none\"");
  log::info("loaded {} ({} layers, hidden {}, {} experts) from {}", config.model_type, config.num_hidden_layers,
            config.hidden_size, config.n_routed_experts, dir.string());
  m.model = std::make_unique<MlaMoeModel>(std::move(config), std::move(weights));
  // model.threads: the CPU kernels' OpenMP team size (0 keeps OpenMP's default, one per core).
  m.model->set_threads(static_cast<int>(model.get_int("threads", 0)));
  return m;
}

std::unique_ptr<KvCache> make_kv_cache(const LoadedModel& m, int64_t tokens) {
  const ModelConfig& c = m.model->config();
  const int64_t bs = m.layout->geometry().block_size;
  const int64_t blocks = (tokens + bs - 1) / bs;
  const int64_t layers = c.num_hidden_layers + static_cast<int64_t>(m.model->weights().mtp.size());
  return std::make_unique<KvCache>(m.layout, layers, blocks, c.has_indexer() ? c.index_head_dim : 0);
}

}  // namespace kiln
