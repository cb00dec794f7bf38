// `kiln quantize --format exl3` as users run it (the built kiln binary, which finds the quantizer in the built plugin):
// a killed run resumes to the same bytes, and the trained tiny GLM quantized (a subset of its weights, to keep CI
// fast; the README has the whole model) loads through `weights.format = "exl3"` and stays close to bf16.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "model/safetensors_writer.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::exl3 {
namespace {
namespace fs = std::filesystem;

const fs::path kTinyGlm = fs::path(KILN_SOURCE_DIR) / "models" / "tiny-glm";

int run_kiln(const std::string& args, const fs::path& output = "/dev/null") {
  const std::string cmd = std::string(KILN_EXECUTABLE) + " quantize " + args + " > " + output.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path scratch(const std::string& what) {
  fs::path dir = fs::temp_directory_path() / ("kiln-quantize-" + what + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TEST(Exl3QuantizeCli, ResumedRunWritesTheSameBytes) {
  const fs::path a = scratch("resumed"), b = scratch("straight");
  const std::string opts = "--bits 8 --head-bits 16 --threads 2 --only 'layers\\.1\\.mlp\\.experts\\.0\\.' " +
                           kTinyGlm.string() + " ";
  // Killed after one tensor (--max-tensors stands in for the kill: partial files are renamed into place whole).
  ASSERT_EQ(run_kiln(opts + a.string() + " --max-tensors 1"), 3);
  int partial = 0;
  for (const auto& e : fs::directory_iterator(a / ".partial")) partial += e.path().extension() == ".safetensors";
  EXPECT_EQ(partial, 1);
  EXPECT_FALSE(fs::exists(a / "model.safetensors"));
  // Another job's options are refused rather than mixed in.
  EXPECT_NE(run_kiln("--bits 7 --head-bits 16 --only 'layers\\.1\\.mlp\\.experts\\.0\\.' " + kTinyGlm.string() + " " +
                     a.string()),
            0);
  ASSERT_EQ(run_kiln(opts + a.string()), 0);
  ASSERT_EQ(run_kiln(opts + b.string()), 0);
  EXPECT_FALSE(fs::exists(a / ".partial"));
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"}) {
    ASSERT_TRUE(fs::exists(a / f)) << f;
    EXPECT_TRUE(read_all(a / f) == read_all(b / f)) << f << " differs between the resumed and the straight run";
  }
  const std::string config = read_all(a / "config.json");
  EXPECT_NE(config.find("\"quant_method\": \"exl3\""), std::string::npos) << config;
  EXPECT_NE(config.find("\"head_bits\": 16"), std::string::npos) << config;
  fs::remove_all(a);
  fs::remove_all(b);
}

std::vector<std::string> sets(const fs::path& path, const std::string& format) {
  return {"model.path=" + path.string(), "model.device=cpu", "weights.format=" + format, "kv.layout=fp32",
          "kv.block_size=4"};
}

// A selected weight that cannot be converted is refused with its name and the checkpoint's directory.
TEST(Exl3QuantizeCli, RefusesWeightsItCannotConvertNamingThem) {
  const fs::path dir = scratch("bad-input");
  fs::create_directories(dir / "in");
  kiln::testing::write_file(dir / "in" / "config.json", "{}");
  auto check = [&](const kiln::testing::TensorSpec& spec, const std::string& expected) {
    kiln::testing::write_file(dir / "in" / "model.safetensors", kiln::testing::build_safetensors({spec}));
    fs::remove_all(dir / "out");
    EXPECT_NE(run_kiln("--bits 4 " + (dir / "in").string() + " " + (dir / "out").string(), dir / "log"), 0);
    const std::string log = read_all(dir / "log");
    EXPECT_NE(log.find(expected), std::string::npos) << log;
    EXPECT_NE(log.find(spec.name), std::string::npos) << log;
  };
  check({"model.layers.0.mlp.up_proj.weight", "I32", {4, 4}, std::string(64, '\0')}, "is I32");
  check({"model.layers.0.mlp.experts.gate_up_proj.weight", "BF16", {2, 4, 4}, std::string(64, '\0')},
        "not a 2-D Linear weight");
  fs::remove_all(dir);
}

struct Agreement {
  int forced_same = 0;      // teacher-forced: both read the bf16 model's greedy continuation; positions where the
                            // quantized model's argmax is the token bf16 chose
  int free_same = 0;        // free-running: each generates alone; positions with the same token (one early
                            // difference makes the rest differ, so this is the harsh measure)
  int total = 0;
  double drift = 0;         // max |Δ logit| / max |logit| over every teacher-forced position
};

// Logits [rows, vocab] for every position of `tokens` in one step.
std::vector<float> all_logits(LoadedModel& m, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  kiln::testing::TestKv kv(m, n);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, n).ok());
  SequenceStep step{tokens, 0, &table, true};
  StepOptions options;
  options.want_logits = true;
  StepOutput o;
  EXPECT_TRUE(m.model->step({&step, 1}, {}, kv.views(), options, o).ok());
  return o.logits;
}

Agreement compare_with_bf16(const fs::path& quantized, int prompts_count, int tokens) {
  {
    PluginLoader loader(global_registry());
    const Status s = loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-quant-exl3.so");
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kAlreadyExists) << s.to_string();
  }
  LoadedModel q = kiln::testing::load_recipe_model(sets(quantized, "exl3"));
  LoadedModel b = kiln::testing::load_recipe_model(sets(kTinyGlm, "dense"));
  Agreement a;
  if (!q.model || !b.model) return a;
  const int64_t vocab = b.model->vocab_size();
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts = {{1, 17, 400, 23, 9, 3000, 77}, {5, 6, 7, 8, 9, 10}, {2048, 31, 999}};
  while (static_cast<int>(prompts.size()) < prompts_count) {
    std::vector<int32_t> p(4 + rng() % 8);
    for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
    prompts.push_back(p);
  }
  prompts.resize(static_cast<size_t>(prompts_count));
  for (const auto& prompt : prompts) {
    const auto tb = kiln::testing::greedy_reference(b, prompt, tokens);
    const auto tq = kiln::testing::greedy_reference(q, prompt, tokens);
    for (size_t i = 0; i < std::min(tq.size(), tb.size()); ++i) a.free_same += tq[i] == tb[i];
    a.total += static_cast<int>(tb.size());
    std::vector<int32_t> forced = prompt;
    forced.insert(forced.end(), tb.begin(), tb.end() - 1);
    const std::vector<float> lq = all_logits(q, forced), lb = all_logits(b, forced);
    if (lq.size() != lb.size() || lb.size() != forced.size() * static_cast<size_t>(vocab)) {
      ADD_FAILURE() << "teacher-forced logits: " << lq.size() << " and " << lb.size() << " values";
      return a;
    }
    a.drift = std::max(a.drift, kiln::testing::relative_error(lq.data(), lb.data(), static_cast<int64_t>(lb.size())));
    for (size_t i = 0; i < tb.size(); ++i) {
      const float* row = lq.data() + (prompt.size() - 1 + i) * static_cast<size_t>(vocab);
      a.forced_same += static_cast<int32_t>(std::max_element(row, row + vocab) - row) == tb[i];
    }
  }
  std::printf("%s: teacher-forced top-1 agreement %d of %d, free-running %d of %d (%d prompts); logit drift %.4f\n",
              quantized.string().c_str(), a.forced_same, a.total, a.free_same, a.total, prompts_count, a.drift);
  return a;
}

// Layer 1's first four experts at K4 (1,536 tiles, ≈ 20 s on 2 idle cores). The trained tiny model's top logits
// are close together (val loss 6.0), so ~7 % weight error moves greedy tokens more than in a real model; measured:
// teacher-forced top-1 agreement 45 of 48 (free-running 31 of 48), logit drift 0.16 (max over all 3 × 16 positions
// of max |Δ| / max |logit|). The README has the whole model.
TEST(Exl3QuantizeCli, QuantizedTinyGlmStaysCloseToBf16) {
  const fs::path out = scratch("tiny-glm-k4");
  ASSERT_EQ(run_kiln("--bits 4 --codebook mcg --head-bits 16 --threads 2 "
                     "--only 'layers\\.1\\.mlp\\.experts\\.[0-3]\\.' " +
                     kTinyGlm.string() + " " + out.string()),
            0);
  const Agreement a = compare_with_bf16(out, 3, 16);
  EXPECT_GE(a.forced_same, a.total * 8 / 10);
  EXPECT_LT(a.drift, 0.25);
  EXPECT_GT(a.drift, 0.0) << "the quantized weights must actually be in use";
  fs::remove_all(out);
}

// A measurement, not a check: KILN_EXL3_MEASURE=<dir of a quantized tiny-glm> compares a whole-model quantization
// (made with `kiln quantize`, minutes on the CPU) with bf16 over 8 prompts × 32 tokens; the README's figures.
TEST(Exl3QuantizeCli, MeasureQuantizedTinyGlm) {
  const char* dir = std::getenv("KILN_EXL3_MEASURE");
  if (!dir) GTEST_SKIP() << "set KILN_EXL3_MEASURE to a quantized tiny-glm directory";
  compare_with_bf16(dir, 8, 32);
}

}  // namespace
}  // namespace kiln::exl3
