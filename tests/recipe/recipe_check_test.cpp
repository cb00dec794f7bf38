// `kiln recipe check` through check_recipe_file: what can be known before load (model path and config, the device,
// the selected plugins on it, the drafter's needs), every problem reported with its key and origin, with the real
// registry (built-ins and the draft-mtp plugin from the build tree).
#include "recipe/recipe_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_loader.h"
#include "plugin/plugin_loader.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

fs::path recipe(const std::string& name) {
  return fs::path(KILN_SOURCE_DIR) / "tests/data/recipes" / name;
}
std::string model_dir(const std::string& name) {
  return (fs::path(KILN_SOURCE_DIR) / "tests/data/models" / name).string();
}

const Registry& registry() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-draft-mtp.so");
  }();
  EXPECT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-draft-mtp target)";
  return global_registry();
}

RecipeCheck check(const std::string& file, const std::vector<std::string>& sets = {}) {
  return check_recipe_file(recipe(file), sets, registry());
}

std::string messages(const RecipeCheck& c) {
  std::string all;
  for (const auto& p : c.problems) all += p.message() + "\n";
  return all;
}

// The one problem `c` reports that mentions `key` (a failure when none or several do).
std::string problem_about(const RecipeCheck& c, const std::string& key) {
  std::string found;
  int n = 0;
  for (const auto& p : c.problems)
    if (p.message().find(key) != std::string::npos) found = p.message(), ++n;
  EXPECT_EQ(n, 1) << "problems mentioning " << key << ":\n" << messages(c);
  return found;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RecipeCheck, FineRecipePasses) {
  RecipeCheck c = check("check_ok.toml");
  EXPECT_TRUE(c.ok()) << messages(c);
  ASSERT_TRUE(c.recipe.has_value());
  RecipeCheck mtp = check("check_ok.toml", {"speculative.method=mtp", "speculative.depth=3"});
  EXPECT_TRUE(mtp.ok()) << messages(mtp);
}

TEST(RecipeCheck, NanUtilizationIsRefused) {
  RecipeCheck c = check("check_ok.toml", {"scheduler.gpu_memory_utilization=nan"});
  EXPECT_TRUE(has(problem_about(c, "gpu_memory_utilization"),
                  "`scheduler.gpu_memory_utilization` in --set scheduler.gpu_memory_utilization=nan: nan is not a "
                  "finite number"))
      << messages(c);
}

TEST(RecipeCheck, NonexistentModelPath) {
  RecipeCheck c = check("check_missing_model.toml");
  const std::string m = problem_about(c, "model.path");
  EXPECT_TRUE(has(m, "check_missing_model.toml:3)")) << m;
  EXPECT_TRUE(has(m, "no-such-model does not exist")) << m;
}

TEST(RecipeCheck, ModelPathWithoutConfig) {
  RecipeCheck c = check("check_no_config.toml");
  const std::string m = problem_about(c, "model.path");
  EXPECT_TRUE(has(m, "check_no_config.toml:3)")) << m;
  EXPECT_TRUE(has(m, "holds no config.json")) << m;
}

TEST(RecipeCheck, UnknownModelType) {
  RecipeCheck c = check("check_unknown_arch.toml");
  const std::string m = problem_about(c, "model.path");
  EXPECT_TRUE(has(m, "check_unknown_arch.toml:3)")) << m;
  EXPECT_TRUE(has(m, "model_type 'llama' is not supported; supported: ")) << m;
}

TEST(RecipeCheck, TensorParallelismSaysWhatItNeeds) {
  // CPU: ranks as threads, said in a note.
  RecipeCheck cpu = check("check_ok.toml", {"parallel.tensor=2", "model.device=cpu"});
  for (const auto& p : cpu.problems) EXPECT_EQ(p.message().find("parallel.tensor"), std::string::npos) << p.to_string();
  bool noted = false;
  for (const std::string& n : cpu.notes) noted = noted || has(n, "2 CPU ranks as threads of this process");
  EXPECT_TRUE(noted) << messages(cpu);
  // CUDA: one process per rank, so ranks as threads are refused, saying what each backend needs; over `socket` a
  // note says the ranks meet through host memory (a correctness path).
  RecipeCheck gpu = check("check_ok.toml", {"parallel.tensor=2", "model.device=cuda", "kv.layout=bf16"});
  const std::string local_gpu = problem_about(gpu, "parallel.tensor");
  EXPECT_TRUE(has(local_gpu, "2 ranks on CUDA run one process each")) << messages(gpu);
  EXPECT_TRUE(has(local_gpu, "needs 2 GPUs, one per rank")) << messages(gpu);
  EXPECT_TRUE(has(local_gpu, "this machine sees ")) << messages(gpu);
  RecipeCheck gpu_socket = check("check_ok.toml", {"parallel.tensor=2", "model.device=cuda", "kv.layout=bf16",
                                                   "transport.backend=socket"});
  for (const auto& p : gpu_socket.problems) EXPECT_FALSE(has(p.message(), "parallel.tensor")) << p.to_string();
  noted = false;
  for (const std::string& n : gpu_socket.notes)
    noted = noted || (has(n, "2 CUDA ranks, one process each") && has(n, "meeting through host memory") &&
                      has(n, "not a fast one"));
  EXPECT_TRUE(noted) << messages(gpu_socket);
  RecipeCheck gpu_draft = check("check_ok.toml", {"parallel.tensor=2", "model.device=cuda", "kv.layout=bf16",
                                                  "transport.backend=socket", "speculative.method=mtp",
                                                  "speculative.depth=2"});
  // MTP drafting on CUDA ranks is accepted (every rank runs the next-n steps on its shard), said in a note.
  for (const auto& p : gpu_draft.problems)
    EXPECT_FALSE(has(p.message(), "speculative.method") || has(p.message(), "parallel.tensor")) << p.to_string();
  noted = false;
  for (const std::string& n : gpu_draft.notes)
    noted = noted || (has(n, "speculative.method") && has(n, "on 2 CUDA ranks: every rank runs the drafter's"));
  EXPECT_TRUE(noted) << messages(gpu_draft);
  // What load refuses is still refused: a next-n drafter on a checkpoint without next-n layers.
  RecipeCheck no_mtp = check("check_ok.toml", {"parallel.tensor=2", "model.device=cuda", "kv.layout=bf16",
                                               "transport.backend=socket", "speculative.method=mtp",
                                               "speculative.depth=2", "model.path=\"" +
                                               model_dir("deepseek_v3-tiny") + "\""});
  // (A kiln built without CUDA, like the sanitized CI pass, refuses the device itself and checks no further.)
  if (!has(messages(no_mtp), "built without CUDA"))
    EXPECT_TRUE(has(problem_about(no_mtp, "speculative.method"), "this checkpoint has none")) << messages(no_mtp);
  // Decode-context parallelism: a note on CPU ranks; on CUDA a note where it spans the whole tensor-parallel group,
  // refused naming its key where it would not.
  RecipeCheck dcp = check("check_ok.toml", {"parallel.tensor=2", "parallel.decode_context=2", "model.device=cpu"});
  EXPECT_TRUE(dcp.problems.empty()) << messages(dcp);
  noted = false;
  for (const std::string& n : dcp.notes) noted = noted || has(n, "groups of 2 consecutive ranks split the KV cache");
  EXPECT_TRUE(noted) << messages(dcp);
  RecipeCheck dcp_gpu = check("check_ok.toml", {"parallel.tensor=2", "parallel.decode_context=2", "model.device=cuda",
                                                "kv.layout=bf16", "transport.backend=socket"});
  if (!has(messages(dcp_gpu), "built without CUDA")) {
    // (Without a GPU here the device itself is a problem; none names the split.)
    for (const auto& p : dcp_gpu.problems) EXPECT_FALSE(has(p.message(), "decode_context")) << messages(dcp_gpu);
    noted = false;
    for (const std::string& n : dcp_gpu.notes) noted = noted || has(n, "2 CUDA ranks split the KV cache by token");
    EXPECT_TRUE(noted) << messages(dcp_gpu);
    RecipeCheck part = check("check_ok.toml", {"parallel.tensor=4", "parallel.decode_context=2", "model.device=cuda",
                                               "kv.layout=bf16", "transport.backend=socket"});
    EXPECT_TRUE(has(problem_about(part, "parallel.decode_context"), "whole tensor-parallel group")) << messages(part);
  }
  // Ranks as processes: how many, who starts them, which ports.
  RecipeCheck procs = check("check_ok.toml", {"parallel.tensor=4", "parallel.decode_context=2", "model.device=cpu",
                                              "transport.backend=socket"});
  EXPECT_TRUE(procs.problems.empty()) << messages(procs);
  noted = false;
  for (const std::string& n : procs.notes)
    noted = noted || (has(n, "4 CPU ranks, one process each") && has(n, "start 3 rank processes") &&
                      has(n, "MASTER_PORT .. MASTER_PORT + 3") && has(n, "fails on all and the next goes on") &&
                      has(n, "hangs for 300 s (transport.timeout_s)"));
  EXPECT_TRUE(noted) << messages(procs);
  // The bound on a hung rank is the recipe's.
  RecipeCheck bounded = check("check_ok.toml", {"parallel.tensor=2", "model.device=cpu", "transport.backend=socket",
                                                "transport.timeout_s=7"});
  EXPECT_TRUE(bounded.problems.empty()) << messages(bounded);
  noted = false;
  for (const std::string& n : bounded.notes) noted = noted || has(n, "hangs for 7 s (transport.timeout_s)");
  EXPECT_TRUE(noted) << messages(bounded);
}

// glm5_next's tensor parallelism: the architecture's own answer for the recipe's device, the one its build gives at
// load — CPU ranks and CUDA rank processes both split it within its shapes, whichever backend carries the ranks.
TEST(RecipeCheck, Glm5NextTensorParallelIsJudgedForItsDevice) {
  for (const char* backend : {"transport.backend=local", "transport.backend=socket"}) {
    RecipeCheck cpu = check("glm5_next_tiny.toml", {"parallel.tensor=2", backend});
    EXPECT_TRUE(cpu.problems.empty()) << backend << "\n" << messages(cpu);
  }
  for (const char* device : {"model.device=cpu", "model.device=cuda"}) {
    RecipeCheck too_many = check("glm5_next_tiny.toml", {"parallel.tensor=3", device, "transport.backend=socket"});
    const std::string shapes = problem_about(too_many, "parallel.tensor");
    EXPECT_TRUE(has(shapes, "num_attention_heads = 2, fewer than the ranks that split it")) << device << ": " << shapes;
  }
  // Two CUDA ranks split it too: nothing about sharding (the fixture's KDA heads of 16 are the CUDA kernels' concern,
  // reported on their own).
  RecipeCheck gpu = check("glm5_next_tiny.toml", {"parallel.tensor=2", "model.device=cuda", "transport.backend=socket"});
  for (const auto& p : gpu.problems) EXPECT_FALSE(has(p.message(), "does not shard")) << p.to_string();
  // One rank on CUDA is not a parallel recipe: nothing about parallel.tensor.
  RecipeCheck one = check("glm5_next_tiny.toml", {"model.device=cuda"});
  for (const auto& p : one.problems) EXPECT_FALSE(has(p.message(), "parallel.tensor")) << p.to_string();
}

TEST(RecipeCheck, CudaWithoutAGpu) {
  RecipeCheck c = check("check_ok.toml", {"model.device=cuda", "kv.layout=bf16"});
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is visible";
  const std::string m = problem_about(c, "model.device");
  EXPECT_TRUE(has(m, "`model.device = \"cuda\"` (--set model.device=cuda): ")) << m;
  EXPECT_TRUE(has(m, "no CUDA device is visible to this process") || has(m, "this kiln was built without CUDA")) << m;
}

// A config option kiln would compute differently is refused by the config reader, so `kiln recipe check` names the
// file and the field before anything loads.
TEST(RecipeCheck, ConfigOptionKilnCannotRunIsNamed) {
  const fs::path dir = fs::path(::testing::TempDir()) / "kiln_recipe_check_attention_bias";
  fs::create_directories(dir);
  std::ifstream in(fs::path(model_dir("deepseek_v3-qproj")) / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["attention_bias"] = true;
  std::ofstream(dir / "config.json") << config.dump(2);
  fs::copy_file(fs::path(model_dir("deepseek_v3-qproj")) / "model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  RecipeCheck c = check("check_ok.toml", {"model.path=" + dir.string()});
  const std::string m = problem_about(c, "model.path");
  EXPECT_TRUE(has(m, (dir / "config.json").string() + ": field 'attention_bias' is true")) << m;
  fs::remove_all(dir);
}

// rope_interleave = false runs on the CPU but not in the CUDA runner: a recipe for the GPU is told so by the config's
// capability check (CudaMlaMoeModel::supports), on any machine built with CUDA.
TEST(RecipeCheck, RotateHalfRopeOnCudaIsRefused) {
  RecipeCheck cpu = check("check_ok.toml", {"model.path=" + model_dir("glm4_moe_lite-dense-halves")});
  EXPECT_TRUE(cpu.problems.empty()) << messages(cpu);
  RecipeCheck gpu = check("check_ok.toml", {"model.path=" + model_dir("glm4_moe_lite-dense-halves"),
                                            "model.device=cuda", "kv.layout=bf16"});
  EXPECT_TRUE(has(messages(gpu), "rope_interleave = false is not supported by the CUDA runner") ||
              has(messages(gpu), "this kiln was built without CUDA"))
      << messages(gpu);
}

TEST(RecipeCheck, Fp32LayoutOnCuda) {
  RecipeCheck c = check("check_ok.toml", {"model.device=cuda"});  // check_ok.toml selects kv.layout = "fp32"
  const std::string m = problem_about(c, "kv.layout");
  EXPECT_TRUE(has(m, "`kv.layout = \"fp32\"` (")) << m;
  EXPECT_TRUE(has(m, "check_ok.toml:7)")) << m;
  EXPECT_TRUE(has(m, "kv_layout `fp32` (built in) is implemented on cpu, not on cuda")) << m;
}

TEST(RecipeCheck, Bf16PrecisionOnCudaIsRefused) {
  // model.precision is the CPU runner's arithmetic: refused with model.device = "cuda", naming the key.
  RecipeCheck on_cuda = check("check_ok.toml", {"model.device=cuda", "model.precision=bf16"});
  const std::string m = problem_about(on_cuda, "model.precision");
  EXPECT_TRUE(has(m, "has no effect on CUDA")) << messages(on_cuda);
  EXPECT_TRUE(has(m, "`model.precision = \"bf16\"` (--set model.precision=bf16): ")) << m;
  // Both families model the GPU's rounding on the CPU.
  EXPECT_TRUE(check("glm5_next_tiny.toml", {"model.precision=bf16"}).problems.empty())
      << messages(check("glm5_next_tiny.toml", {"model.precision=bf16"}));
  EXPECT_TRUE(check("check_ok.toml", {"model.precision=bf16"}).problems.empty());
}

TEST(RecipeCheck, CustomAllReduceWithLocalCollective) {
  RecipeCheck c = check("check_ok.toml", {"transport.custom_all_reduce=on"});
  const std::string m = problem_about(c, "transport.custom_all_reduce");
  EXPECT_TRUE(has(m, "the collective `local` does not take it")) << m;
  EXPECT_TRUE(has(m, "no collective plugin providing NCCL is loaded")) << m;
}

TEST(RecipeCheck, TransportEnvWithLocalCollective) {
  RecipeCheck c = check("check_ok.toml", {"transport.env={NCCL_CUMEM_ENABLE=\"0\"}"});
  const std::string m = problem_about(c, "transport.env");
  EXPECT_TRUE(has(m, "the collective `local` does not take it")) << m;
  EXPECT_TRUE(has(m, "no collective plugin providing NCCL is loaded")) << m;
}

TEST(RecipeCheck, VideoWithTextModality) {
  RecipeCheck c = check("check_ok.toml", {"media.video=true"});
  const std::string m = problem_about(c, "media.video");
  EXPECT_TRUE(has(m, "`media.video = true` (--set media.video=true): the modality `text` accepts no video")) << m;
  EXPECT_TRUE(check("check_ok.toml", {"media.video=false"}).ok());
}

TEST(RecipeCheck, DraftKvDtypeWithMtp) {
  RecipeCheck c = check("check_ok.toml", {"speculative.method=mtp", "speculative.draft_kv_dtype=fp8"});
  const std::string m = problem_about(c, "draft_kv_dtype");
  EXPECT_TRUE(has(m,
                  "`speculative.draft_kv_dtype` (--set speculative.draft_kv_dtype=fp8): \"fp8\": the drafter "
                  "`mtp` keeps no KV cache of its own"))
      << m;
}

TEST(RecipeCheck, DraftModelWithMtp) {
  RecipeCheck c =
      check("check_ok.toml", {"speculative.method=mtp", "speculative.draft_model=" + model_dir("deepseek_v3-tiny")});
  const std::string m = problem_about(c, "draft_model");
  EXPECT_TRUE(has(m, "the drafter `mtp` loads no checkpoint of its own; remove the key")) << m;
}

TEST(RecipeCheck, MtpWithoutNextNLayers) {
  RecipeCheck c = check("check_ok.toml", {"model.path=" + model_dir("deepseek_v3-tiny"), "speculative.method=mtp"});
  const std::string m = problem_about(c, "speculative.method");
  EXPECT_TRUE(has(m, "`speculative.method = \"mtp\"` (--set speculative.method=mtp): ")) << m;
  EXPECT_TRUE(has(m, "num_nextn_predict_layers")) << m;
}

// Problems of every kind in one file: all reported, each with its line.
TEST(RecipeCheck, ReportsEveryProblemWithItsLine) {
  RecipeCheck c = check("check_bad.toml");
  EXPECT_EQ(c.problems.size(), 4u) << messages(c);
  EXPECT_TRUE(has(problem_about(c, "parallel.decode_context"), "check_bad.toml:7")) << messages(c);
  EXPECT_TRUE(has(problem_about(c, "transport.custom_all_reduce"), "check_bad.toml:10")) << messages(c);
  EXPECT_TRUE(has(problem_about(c, "gpu_memory_utilization"), "check_bad.toml:13")) << messages(c);
  EXPECT_TRUE(has(problem_about(c, "media.video"), "check_bad.toml:16")) << messages(c);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// scheduler.batch_invariant on CUDA: more sequences than the runner's 32 batch-invariant rows are refused before
// loading, naming max_num_seqs; within it a note states the step and chunk limits; on the CPU (invariant at any
// size) nothing is said.
TEST(RecipeCheck, BatchInvariantOnCudaNeedsMaxNumSeqsWithinTheBound) {
  RecipeCheck wide = check("check_ok.toml", {"model.device=cuda", "kv.layout=bf16", "scheduler.batch_invariant=true",
                                             "scheduler.max_num_seqs=64"});
  const std::string about_seqs = problem_about(wide, "scheduler.max_num_seqs");
  EXPECT_TRUE(has(about_seqs, "batch-invariant up to 32 rows")) << messages(wide);
  RecipeCheck fits = check("check_ok.toml", {"model.device=cuda", "kv.layout=bf16", "scheduler.batch_invariant=true",
                                             "scheduler.max_num_seqs=16"});
  auto mentions = [](const RecipeCheck& c, const std::string& key) {
    return std::count_if(c.problems.begin(), c.problems.end(),
                         [&](const Status& p) { return p.message().find(key) != std::string::npos; });
  };
  EXPECT_EQ(mentions(fits, "max_num_seqs"), 0) << messages(fits);
  bool noted = false;
  for (const std::string& n : fits.notes) noted = noted || has(n, "prompt chunks of 32");
  EXPECT_TRUE(noted) << messages(fits);
  RecipeCheck cpu = check("check_ok.toml", {"model.device=cpu", "scheduler.batch_invariant=true",
                                            "scheduler.max_num_seqs=64"});
  EXPECT_EQ(mentions(cpu, "max_num_seqs"), 0) << messages(cpu);
}

}  // namespace
}  // namespace kiln
