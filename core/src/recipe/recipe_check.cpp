#include "recipe/recipe_check.h"

#include <algorithm>
#include <memory>
#include <system_error>

#include "kiln/device_context.h"
#include "kiln/draft_services.h"
#include "kiln/drafter.h"
#include "kiln/kv_layout.h"
#include "kiln/modality.h"
#include "kiln/weight_format.h"
#include "model/arch/architecture.h"
#include "model/batch_invariance.h"
#include "model/checkpoint.h"
#include "model/model_loader.h"
#include "recipe/core_schema.h"
#include "recipe/drafter_settings.h"
#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace fs = std::filesystem;

namespace {

// "`kv.layout = "fp32"` (configs/x.toml:4)": the setting a problem is about, as the recipe wrote it.
std::string setting(const RecipeSection& section, const std::string& key) {
  auto it = section.values().find(key);
  std::string text = "`" + section.name() + "." + key;
  if (it != section.values().end()) text += " = " + render_recipe_value(it->second);
  return text + "` (" + section.origin(key) + ")";
}

Status about(const RecipeSection& section, const std::string& key, const Status& why) {
  return Status(why.code(), setting(section, key) + ": " + why.message());
}

// What `kiln recipe check` lends a drafter's factory in place of the engine's services: the model's dimensions, read
// from its config, and nothing that needs the model loaded. Every such request is refused and remembered, so a
// factory that fails after one is known to need the model (and is left to load time) rather than to refuse the recipe.
class ModelFreeServices final : public DraftServices {
 public:
  ModelFreeServices(Device device, const ModelInfo& info, const Recipe& recipe)
      : device_(device, needed_),
        weights_(needed_),
        info_(info),
        block_size_(recipe.section("kv").get_int("block_size")),
        draft_model_(recipe.section("speculative").get_string("draft_model")) {}

  // Whether the factory asked for anything beyond the model's dimensions.
  bool needed_the_model() const { return needed_; }

  DeviceContext& device() override { return device_; }
  int64_t hidden_size() const override { return info_.hidden_size; }
  int64_t vocab_size() const override { return info_.vocab_size; }
  int64_t num_target_layers() const override { return info_.num_layers; }
  Status embed(const int32_t*, int64_t, TensorView) override { return refuse(needed_); }
  Status lm_head(const TensorView&, float*) override { return refuse(needed_); }
  Status sample(const DraftSampleRequest&) override { return refuse(needed_); }
  int64_t num_mtp_layers() const override { return info_.num_mtp_layers; }
  Status mtp_run(int64_t, const std::vector<MtpRows>&, MtpOutput&) override { return refuse(needed_); }
  void* cache(int64_t, size_t) override {
    needed_ = true;
    return nullptr;
  }
  int64_t block_size() const override { return block_size_; }
  std::string draft_model_path() const override { return draft_model_; }
  Result<std::shared_ptr<const WeightSource>> open_checkpoint(const std::string&) override { return refuse(needed_); }
  WeightFormat& weight_format() override { return weights_; }

 private:
  static Status refuse(bool& needed) {
    needed = true;
    return failed_precondition("`kiln recipe check` loads no model: nothing is allocated, read or run");
  }

  class NoMemory final : public DeviceContext {
   public:
    NoMemory(Device device, bool& needed) : device_(device), needed_(needed) {}
    Device device() const override { return device_; }
    Stream stream() const override { return {device_, nullptr}; }
    Result<void*> allocate(size_t, const char*) override { return refuse(needed_); }
    int multiprocessor_count() const override { return 0; }
    Status copy(void*, const void*, size_t, bool) override { return refuse(needed_); }
    Status synchronize() override { return refuse(needed_); }

   private:
    Device device_;
    bool& needed_;
  };

  class NoWeights final : public WeightFormat {
   public:
    explicit NoWeights(bool& needed) : needed_(needed) {}
    Result<std::unique_ptr<Linear>> load_linear(const WeightSource&, const LinearSpec&) override {
      return refuse(needed_);
    }
    Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource&, const ExpertSpec&) override {
      return refuse(needed_);
    }

   private:
    bool& needed_;
  };

  bool needed_ = false;  // declared before the members that refer to it
  NoMemory device_;
  NoWeights weights_;
  ModelInfo info_;
  int64_t block_size_;
  std::string draft_model_;
};

class Checker {
 public:
  Checker(const Recipe& recipe, const Registry& registry, RecipeCheck& out)
      : recipe_(recipe), registry_(registry), out_(out) {}

  void run() {
    check_model_path();
    check_draft_model_path();
    check_device();
    check_batch_invariant();
    check_parallel();
    check_precision();
    check_capability_devices();
    if (!device_known_ || !can_create_) return;
    check_kv_layout();
    check_modality();
    check_drafter();
  }

 private:
  void problem(Status s) { out_.problems.push_back(std::move(s)); }

  // model.path: a directory with a config.json the architecture registry parses, and the checkpoint files
  // model.load = "mmap" reads (only their presence: nothing is mapped).
  void check_model_path() {
    const RecipeSection& model = recipe_.section("model");
    if (!model.has("path")) return;  // missing or invalid: read_recipe said so
    const fs::path dir = model.get_string("path");
    std::error_code ec;
    if (!fs::exists(dir, ec)) return problem(about(model, "path", not_found(dir.string() + " does not exist")));
    if (!fs::is_directory(dir, ec))
      return problem(about(model, "path",
                           invalid_argument(dir.string() + " is not a directory (a Hugging Face model directory: "
                                                           "config.json, *.safetensors, tokenizer.json)")));
    const fs::path config = dir / "config.json";
    if (!fs::is_regular_file(config, ec))
      return problem(about(model, "path", not_found(dir.string() + " holds no config.json")));
    Result<std::unique_ptr<Architecture>> arch = load_architecture(config);
    if (!arch.ok()) return problem(about(model, "path", arch.status()));
    arch_ = std::move(arch).value();
    info_ = arch_->info();
    info_.checkpoint_dir = dir.string();
    info_.synthetic_weights = model.get_string("load") == "dummy";
    if (model.get_string("load") == "mmap" && !fs::exists(dir / Checkpoint::kSingleFileName, ec) &&
        !fs::exists(dir / Checkpoint::kIndexFileName, ec))
      problem(about(model, "path",
                    not_found(dir.string() + " holds neither " + Checkpoint::kSingleFileName + " nor " +
                              Checkpoint::kIndexFileName +
                              " (model.load = \"mmap\" reads the checkpoint; \"dummy\" "
                              "makes random weights of the config's shapes)")));
  }

  void check_draft_model_path() {
    const RecipeSection& spec = recipe_.section("speculative");
    const std::string dir = spec.get_string("draft_model");
    std::error_code ec;
    if (!dir.empty() && !fs::is_directory(dir, ec))
      problem(about(spec, "draft_model",
                    not_found(dir + (fs::exists(dir, ec) ? " is not a directory" : " does not exist"))));
  }

  // scheduler.batch_invariant on CUDA: the runner's steps hold at most kCudaBatchInvariantMaxRows rows (the weight
  // format may promise fewer, known at load), so more sequences than that could never decode in one step.
  void check_batch_invariant() {
    const RecipeSection& sched = recipe_.section("scheduler");
    if (!device_known_ || device_ != DeviceType::kCuda || !sched.has("batch_invariant") ||
        !sched.get_bool("batch_invariant") || !sched.has("max_num_seqs"))
      return;
    const int64_t seqs = sched.get_int("max_num_seqs");
    if (seqs > kCudaBatchInvariantMaxRows)
      problem(about(sched, "max_num_seqs",
                    invalid_argument(std::to_string(seqs) + " sequences cannot decode in one step under "
                                     "scheduler.batch_invariant: the CUDA runner's steps are batch-invariant up to " +
                                     std::to_string(kCudaBatchInvariantMaxRows) + " rows; set at most that")));
    else
      out_.notes.push_back(setting(sched, "batch_invariant") + ": steps of at most " +
                           std::to_string(kCudaBatchInvariantMaxRows) +
                           " tokens, prompt chunks of " + std::to_string(kCudaBatchInvariantChunkRows) +
                           " (fewer if the weight format promises fewer, known at load)");
  }

  // The device the model would run on. An explicit "cuda" stays the target of the capability checks even where no
  // GPU is visible, so a recipe written for a GPU machine is judged for it.
  void check_device() {
    const RecipeSection& model = recipe_.section("model");
    if (!model.has("device")) return;  // invalid: read_recipe said so
    device_known_ = true;
    const std::string wanted = model.get_string("device");
    if (wanted == "cpu") {
      device_ = DeviceType::kCpu;
    } else if (wanted == "cuda") {
      device_ = DeviceType::kCuda;
#ifdef KILN_WITH_CUDA
      if (!cuda_device_available())
        problem(about(model, "device", unavailable("no CUDA device is visible to this process")));
      if (arch_)
        if (Status s = arch_->supports(DeviceType::kCuda); !s.ok()) problem(about(model, "device", s));
#else
      problem(about(model, "device", failed_precondition("this kiln was built without CUDA (KILN_WITH_CUDA=OFF)")));
      can_create_ = false;  // no CUDA half of any built-in to create
#endif
    } else if (arch_) {
      Result<DeviceType> resolved = resolve_device(recipe_, registry_, *arch_);
      if (!resolved.ok()) return problem(about(model, "device", resolved.status()));
      device_ = *resolved;
      out_.notes.push_back(setting(model, "device") + " runs on " + device_type_name(device_) + " here");
    } else {
      device_known_ = false;  // "auto" resolves against the model's architecture, which could not be read
    }
  }

  // CUDA ranks: one process per rank; what each backend asks of the machine.
  void check_cuda_ranks(int64_t ranks) {
    const RecipeSection& parallel = recipe_.section("parallel");
    const RecipeSection& transport = recipe_.section("transport");
    const std::string backend = transport.get_string("backend", "local");
    const std::string method = recipe_.section("speculative").get_string("method", "none");
    if (method != "none")
      out_.notes.push_back(setting(recipe_.section("speculative"), "method") + " on " + std::to_string(ranks) +
                           " CUDA ranks: every rank runs the drafter's next-n steps, embedding and lm_head calls on "
                           "its shard (rank 0 drafts and samples); a draft step chained on the device waits for rank "
                           "0's stream once, to hand its tokens to the other ranks");
    int gpus = 0;
#ifdef KILN_WITH_CUDA
    if (cuda_device_available()) cudaGetDeviceCount(&gpus);
#endif
    const std::string here = " (this machine sees " + std::to_string(gpus) + ")";
    if (backend == "local")
      return problem(about(parallel, "tensor",
                           unimplemented(std::to_string(ranks) + " ranks on CUDA run one process each: set "
                                         "transport.backend = \"nccl\" (needs " + std::to_string(ranks) +
                                         " GPUs, one per rank, with peer access for the custom all-reduce" + here +
                                         ") or \"socket\" (ranks meeting through host memory; they may share GPUs)")));
    if (backend == "socket") {
      out_.notes.push_back(setting(transport, "backend") + ": " + std::to_string(ranks) +
                           " CUDA ranks, one process each, on GPU LOCAL_RANK mod the visible GPUs" + here +
                           ", meeting through host memory (each collective waits for the stream and copies through "
                           "pinned memory; no CUDA graphs): a correctness path for tests and hosts without peer "
                           "access, not a fast one; `kiln serve` / `kiln generate` start " + std::to_string(ranks - 1) +
                           " rank processes on this machine; a rank that hangs for " + timeout_text(transport) +
                           " stops the group");
      return;
    }
    out_.notes.push_back(setting(parallel, "tensor") + ": " + std::to_string(ranks) + " CUDA ranks over `" + backend +
                         "` need " + std::to_string(ranks) + " GPUs, one per rank (LOCAL_RANK picks it)" + here +
                         "; NCCL refuses two ranks on one GPU; the custom all-reduce needs peer access between them; "
                         "a rank that hangs for " + timeout_text(transport) +
                         " (the communicator's creation or one call) is aborted by the watchdog and stops the group");
  }

  // transport.timeout_s as the notes say it: "300 s (transport.timeout_s)".
  static std::string timeout_text(const RecipeSection& transport) {
    return std::to_string(transport.get_int("timeout_s", 300)) + " s (transport.timeout_s)";
  }

  // What a parallel recipe needs: CPU ranks run as threads of this process over the built-in `local` group or as
  // processes over `socket`; CUDA ranks are one process each (the MLA + MoE runner shards its weights per rank),
  // one GPU per rank over `nccl`, or meeting through host memory over `socket` (ranks may then share GPUs).
  void check_parallel() {
    const RecipeSection& parallel = recipe_.section("parallel");
    const int64_t ranks = parallel.get_int("tensor", 1);
    // What the model allows on its device — the architecture's own answer, the one its build gives at load (each
    // setting judged alone, so the problem names the one at fault). An unknown device ("auto" on a model whose
    // architecture could not be read) is judged as the CPU, whose ranks split every architecture.
    const int groups_of = static_cast<int>(parallel.get_int("decode_context", 1));
    const DeviceType on = device_known_ ? device_ : DeviceType::kCpu;
    bool context_refused = false;  // the architecture's own answer names the setting once
    if (arch_ && groups_of > 1)
      if (Status s = arch_->supports_parallel(1, groups_of, on); !s.ok()) {
        problem(about(parallel, "decode_context", s));
        context_refused = true;
      }
    if (arch_ && ranks > 1)
      if (Status s = arch_->supports_parallel(static_cast<int>(ranks), 1, on); !s.ok())
        problem(about(parallel, "tensor", s));
    if (ranks <= 1 || !device_known_) return;
    if (device_ == DeviceType::kCuda && groups_of > 1 && !context_refused) {
      if (groups_of != ranks)
        problem(about(parallel, "decode_context",
                      unimplemented("on CUDA the KV cache splits over the whole tensor-parallel group: set "
                                    "decode_context = parallel.tensor = " + std::to_string(ranks) +
                                    " (or model.device = \"cpu\" for groups within it)")));
      else
        out_.notes.push_back(setting(parallel, "decode_context") + ": the " + std::to_string(ranks) +
                             " CUDA ranks split the KV cache by token (each stores 1/" + std::to_string(ranks) +
                             " of every sequence's KV in pages of kv.block_size; scheduler blocks of " +
                             std::to_string(recipe_.section("kv").get_int("block_size", 64) * ranks) +
                             " tokens); every head is attended over each rank's tokens and merged by log-sum-exp, so "
                             "logits agree with one rank to rounding rather than bit for bit");
    }
    if (device_ == DeviceType::kCuda) return check_cuda_ranks(ranks);
    const RecipeSection& transport = recipe_.section("transport");
    const std::string backend = transport.get_string("backend", "local");
    const int64_t groups = ranks / std::max<int64_t>(parallel.get_int("decode_context", 1), 1);
    if (backend == "socket") {
      out_.notes.push_back(setting(transport, "backend") + ": " + std::to_string(ranks) +
                           " CPU ranks, one process each (rank 0 serves; ranks 1.. execute its calls on their shard "
                           "with a KV pool of their own): `kiln serve` / `kiln generate` start " +
                           std::to_string(ranks - 1) +
                           " rank processes on this machine, or with --nnodes/--node-rank/--master-addr/"
                           "--master-port this node's share; the ranks meet at MASTER_PORT .. MASTER_PORT + " +
                           std::to_string(1 + (parallel.get_int("decode_context", 1) > 1 ? groups : 0)) +
                           " (TCP), and each process needs the model files and the memory of its shard; a rank that "
                           "fails at start-up ends the start at once, a request that fails on one rank fails on all "
                           "and the next goes on, and a rank that exits — or hangs for " + timeout_text(transport) +
                           ", the bound on one collective call — stops the group until a restart");
    } else if (backend != "local") {
      return problem(about(transport, "backend",
                           invalid_argument("CPU ranks meet through the built-in `local` group (threads of this "
                                            "process) or `socket` (one process per rank); `" + backend +
                                            "` connects GPU ranks")));
    } else {
      out_.notes.push_back(setting(parallel, "tensor") + ": " + std::to_string(ranks) +
                           " CPU ranks as threads of this process (heads, MLP columns, routed experts and vocabulary "
                           "split over them; output bit-identical to one rank)");
    }
    const int64_t context = parallel.get_int("decode_context", 1);
    if (context > 1)
      out_.notes.push_back(setting(parallel, "decode_context") + ": groups of " + std::to_string(context) +
                           " consecutive ranks split the KV cache by token (each rank stores 1/" +
                           std::to_string(context) + " of every sequence's KV; scheduler blocks of " +
                           std::to_string(recipe_.section("kv").get_int("block_size", 64) * context) +
                           " tokens); attention is merged across a group by log-sum-exp, so logits agree with one "
                           "rank to fp32 rounding rather than bit for bit");
  }

  // model.precision is the CPU runner's arithmetic: refused on CUDA, and where the architecture has no such mode.
  void check_precision() {
    const RecipeSection& model = recipe_.section("model");
    if (!model.has("precision") || model.get_string("precision") == "fp32" || !device_known_) return;
    if (device_ == DeviceType::kCuda)
      return problem(about(model, "precision",
                           invalid_argument("is the CPU runner's arithmetic and has no effect on CUDA (the CUDA runner "
                                            "is bf16); remove it or run on the CPU")));
    if (arch_)
      if (Status s = arch_->supports_precision(Precision::kBf16); !s.ok()) problem(about(model, "precision", s));
  }

  // Each selected capability implements the device.
  void check_capability_devices() {
    if (!device_known_) return;
    for (const auto& sec : core_sections()) {
      if (!sec.selector_key) continue;
      const RecipeSection& section = recipe_.section(sec.name);
      if (!section.has(*sec.selector_key)) continue;
      const CapabilityEntry* e = registry_.find(sec.selector_kind, section.get_string(*sec.selector_key));
      if (!e) continue;  // no plugin provides it: read_recipe said so
      if (Status s = Registry::check_device(*e, device_); !s.ok())
        problem(about(section, *sec.selector_key, s));
      else
        usable_.push_back(sec.name);
    }
  }

  // Whether the capability `section` selects implements the device (when not, that was reported).
  bool usable(const std::string& section) const {
    for (const auto& s : usable_)
      if (s == section) return true;
    return false;
  }

  CreateContext context(const std::string& section) const {
    CreateContext ctx;
    ctx.section = &recipe_.section(section);
    ctx.device = Device{device_, 0};
    ctx.model = arch_ ? &info_ : nullptr;
    return ctx;
  }

  // The layout, made for the model's dimensions, must store what the architecture caches.
  void check_kv_layout() {
    if (!arch_ || !usable("kv")) return;
    const RecipeSection& kv = recipe_.section("kv");
    auto layout = registry_.create<KvLayout>(kv.get_string("layout"), context("kv"));
    if (!layout.ok()) return problem(about(kv, "layout", layout.status()));
    const KvGeometry g = (*layout)->geometry();
    if (g.latent_dim != info_.kv_lora_rank || g.rope_dim != info_.qk_rope_head_dim)
      problem(about(kv, "layout",
                    failed_precondition(
                        "stores rows of " + std::to_string(g.latent_dim) + " + " + std::to_string(g.rope_dim) +
                        ", and " + arch_->source() + " caches " + std::to_string(info_.kv_lora_rank) + " + " +
                        std::to_string(info_.qk_rope_head_dim) + " (kv_lora_rank + qk_rope_head_dim) per token")));
  }

  void check_modality() {
    if (!usable("media")) return;
    const RecipeSection& media = recipe_.section("media");
    const std::string name = media.get_string("modality");
    auto modality = registry_.create<Modality>(name, context("media"));
    if (!modality.ok()) return problem(about(media, "modality", modality.status()));
    if (media.get_bool("video") && !(*modality)->accepts_video())
      problem(about(media, "video",
                    invalid_argument("the modality `" + name + "` accepts no video; select one that does (" +
                                     setting(media, "modality") + ") or remove the key")));
  }

  void check_drafter() {
    if (!arch_ || !usable("speculative")) return;
    const RecipeSection& spec = recipe_.section("speculative");
    const std::string method = spec.get_string("method");
    ModelFreeServices services(Device{device_, 0}, info_, recipe_);
    CreateContext ctx = context("speculative");
    ctx.draft_services = &services;
    auto drafter = registry_.create<Drafter>(method, ctx);
    if (!drafter.ok()) {
      if (!services.needed_the_model()) return problem(about(spec, "method", drafter.status()));
      out_.notes.push_back("the drafter `" + method + "` cannot be created without its model loaded (" +
                           drafter.status().message() + "): what it needs is checked at load");
      return;
    }
    const DrafterCapabilities caps = (*drafter)->capabilities();
    for (Status& s : check_drafter_settings(spec, caps)) problem(std::move(s));
    if (caps.needs_target_mtp && info_.num_mtp_layers < 1)
      problem(about(spec, "method",
                    failed_precondition("runs the checkpoint's next-n (MTP) layers, and " + arch_->source() +
                                        " declares none (num_nextn_predict_layers = 0)")));
    const int64_t depth = spec.get_int("depth");
    if (caps.max_depth > 0 && depth > caps.max_depth)
      problem(
          about(spec, "depth",
                out_of_range("is beyond the drafter `" + method + "`'s maximum of " + std::to_string(caps.max_depth))));
  }

  const Recipe& recipe_;
  const Registry& registry_;
  RecipeCheck& out_;
  std::unique_ptr<Architecture> arch_;  // null when model.path could not be read
  ModelInfo info_;
  DeviceType device_ = DeviceType::kCpu;
  bool device_known_ = false;        // whether device_ is where the recipe would run
  bool can_create_ = true;           // whether capabilities can be created for device_ in this build
  std::vector<std::string> usable_;  // sections whose selected capability implements device_
};

}  // namespace

void check_recipe(const Recipe& recipe, const Registry& registry, RecipeCheck& out) {
  Checker(recipe, registry, out).run();
}

RecipeCheck check_recipe_file(const fs::path& file, const std::vector<std::string>& overrides,
                              const Registry& registry) {
  RecipeRead read = read_recipe(file, overrides, registry);
  RecipeCheck out;
  out.problems = std::move(read.problems);
  out.recipe = std::move(read.recipe);
  if (out.recipe) check_recipe(*out.recipe, registry, out);
  return out;
}

}  // namespace kiln
