// The tiny glm4_moe_lite fixture with EXL3 projections and experts (one K and codebook per expert projection across
// a layer's experts, as the CUDA expert kernels need; other projections of every K and codebook; one q_b_proj left
// dense), loaded through `weights.format = "exl3"` on the CPU and on CUDA from the built plugin: the same greedy
// tokens. The CPU runs fp32 throughout, the CUDA runner keeps bf16 activations between blocks, so a divergence at a
// near-tie would be a rounding artefact; the test reports the first differing step. Skips without a CUDA device.
// A second test does the same for `kiln quantize`'s output of the fixture. The plugin comes from $KILN_EXL3_PLUGIN
// (a path to kiln-quant-exl3.so) or the build tree; the quantizer runs as the built kiln binary.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "exl3_module.h"
#include "exl3_fixture_checkpoint.h"
#include "exl3_test_source.h"
#include "model/safetensors_file.h"
#include "model/safetensors_writer.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::exl3 {
namespace {
namespace fs = std::filesystem;

// Most projections EXL3: the experts with one K and codebook per projection kind across a layer's experts (as the
// CUDA expert kernels need), the others of every K and codebook; one q_b_proj left dense.
void write_checkpoint(const fs::path& dir) {
  test::write_exl3_fixture(
      dir,
      [](const std::string& name, const TensorView& t, int index) -> std::optional<test::ModuleOptions> {
        if (!name.ends_with("_proj.weight") || t.rank != 2 || name == "model.layers.1.self_attn.q_b_proj.weight")
          return std::nullopt;
        const std::string module = name.substr(0, name.size() - 7);
        test::ModuleOptions o;
        if (module.find(".experts.") != std::string::npos) {  // K and codebook from the projection's name only
          const bool gate = module.ends_with("gate_proj"), up = module.ends_with("up_proj");
          o.bits = gate ? 3 : up ? 4 : 5;
          o.codebook = gate ? Codebook::kMcg : up ? Codebook::kMul1 : Codebook::k3Inst;
        } else {
          o.bits = 2 + index % 5;
          o.codebook = static_cast<Codebook>(index % 3);
        }
        return o;
      },
      2000);
}

// Skips without a CUDA device; loads the built plugin once; a scratch checkpoint folder removed afterwards.
class Exl3CudaModel : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    static const Status loaded = [] {
      PluginLoader loader(global_registry());
      const char* env = std::getenv("KILN_EXL3_PLUGIN");
      return loader.load_file(env ? fs::path(env) : fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-quant-exl3.so");
    }();
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    dir_ = fs::temp_directory_path() / ("kiln-exl3-cuda-model-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

// The EXL3 checkpoint in `dir` through `weights.format = "exl3"` on the CPU and on CUDA (bf16 activations): the same
// 12 greedy tokens. `cpu_precision` bf16 rounds the CPU's activations where the CUDA runner does (the core's contract
// for free-running identity, tests/gpu/cuda_model_test.cpp); fp32 holds where the top logits are far apart.
void expect_same_greedy_on_cpu_and_cuda(const fs::path& dir, const char* what, const std::string& cpu_precision) {
  auto sets = [&](const std::string& device, const std::string& kv) {
    std::vector<std::string> s = {"model.path=" + dir.string(), "model.device=" + device, "weights.format=exl3",
                                  "kv.layout=" + kv, "kv.block_size=4", "scheduler.max_model_len=256"};
    if (device == "cpu" && cpu_precision != "fp32") s.push_back("model.precision=" + cpu_precision);
    return s;
  };
  LoadedModel cpu = kiln::testing::load_recipe_model(sets("cpu", "fp32"));
  LoadedModel gpu = kiln::testing::load_recipe_model(sets("cuda", "bf16"));
  ASSERT_TRUE(cpu.model && gpu.model);
  ASSERT_TRUE(gpu.on_gpu());
  const std::vector<int32_t> prompt = {1, 17, 400, 23, 9, 3000, 77};
  const auto want = kiln::testing::greedy_reference(cpu, prompt, 12);
  const auto got = kiln::testing::greedy_reference(gpu, prompt, 12);
  ASSERT_EQ(want.size(), 12u);
  size_t same = 0;
  while (same < want.size() && same < got.size() && want[same] == got[same]) ++same;
  std::printf("%s: %zu of %zu greedy tokens identical on CPU and CUDA\n", what, same, want.size());
  EXPECT_EQ(got, want);
}

TEST_F(Exl3CudaModel, TinyModelGreedyTokensMatchOnCpuAndCuda) {
  write_checkpoint(dir_);
  if (HasFatalFailure()) return;
  expect_same_greedy_on_cpu_and_cuda(dir_, "exl3 tiny model (random modules)", "fp32");
}

// The quantizer's own output, as users make it: `kiln quantize --bits 4 --head-bits 6` of the tiny glm4_moe_lite
// fixture (every projection, every expert and the head quantized by the Viterbi search), then the same greedy tokens
// on the CPU and on CUDA.
TEST_F(Exl3CudaModel, QuantizedTinyModelGreedyTokensMatchOnCpuAndCuda) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const fs::path log = dir_.string() + ".log";
  const std::string cmd = std::string(KILN_EXECUTABLE) + " quantize --bits 4 --head-bits 6 --threads " +
                          std::to_string(threads) + " " + kiln::testing::model_dir("glm4_moe_lite-tiny").string() + " " +
                          dir_.string() + " > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  fs::remove(log);
  // Against the CPU in fp32 the first H200 run agreed on 4 of 12 tokens: the quantized random-init fixture's top
  // logits sit within bf16 rounding of each other, so the CPU rounds where the GPU does.
  expect_same_greedy_on_cpu_and_cuda(dir_, "exl3 tiny model (kiln quantize K4, head K6)", "bf16");
}

// `kiln quantize --experts-only`: the routed experts EXL3, every other projection dense, which the format hands to
// the built-in `dense` format (CreateContext::dense_weights) on both devices: the same greedy tokens.
TEST_F(Exl3CudaModel, ExpertsOnlyQuantizedTinyModelGreedyTokensMatchOnCpuAndCuda) {
  const fs::path log = dir_.string() + ".log";
  const std::string cmd = std::string(KILN_EXECUTABLE) + " quantize --bits 3 --experts-only --threads " +
                          std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " " +
                          kiln::testing::model_dir("glm4_moe_lite-tiny").string() + " " + dir_.string() + " > " +
                          log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  fs::remove(log);
  expect_same_greedy_on_cpu_and_cuda(dir_, "exl3 tiny model (kiln quantize K3, experts only)", "bf16");
}

}  // namespace
}  // namespace kiln::exl3
