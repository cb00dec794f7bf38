// The glm4_moe_lite-tiny fixture rewritten with chosen projections as random EXL3 modules (exl3_test_source.h), for
// the tests that load a whole model through `weights.format = "exl3"` on the CPU and on CUDA.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "exl3_test_source.h"
#include "model/safetensors_file.h"
#include "model/safetensors_writer.h"

namespace kiln::exl3::test {

inline const char* safetensors_dtype(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    default: return "?";
  }
}

inline kiln::testing::TensorSpec spec_of(const std::string& name, const TensorView& t) {
  kiln::testing::TensorSpec s{name, safetensors_dtype(t.dtype), {}, {}};
  for (int i = 0; i < t.rank; ++i) s.shape.push_back(t.shape[i]);
  s.bytes.assign(static_cast<const char*>(t.data), t.nbytes());
  return s;
}

// Which tensors become EXL3 modules and how: `pick(name, tensor, index)` returns the module's options for a weight to
// convert (index counts the converted ones so far), nothing to keep it as stored.
using ModulePick =
    std::function<std::optional<ModuleOptions>(const std::string& name, const TensorView& t, int index)>;

// Writes `dir` (created) with the fixture's config and tokenizer and a model.safetensors in which every weight `pick`
// chooses is a random EXL3 module (seed `seed` + its index). Returns how many were converted; 0 when the fixture
// could not be read (a test failure is recorded).
inline int write_exl3_fixture(const std::filesystem::path& dir, const ModulePick& pick, uint32_t seed) {
  const std::filesystem::path fixture = kiln::testing::model_dir("glm4_moe_lite-tiny");
  auto file = SafetensorsFile::open(fixture / "model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().to_string();
  if (!file.ok()) return 0;
  std::vector<kiln::testing::TensorSpec> specs;
  int index = 0;
  for (const std::string& name : file->names()) {
    const TensorView t = *file->get(name);
    const std::optional<ModuleOptions> o = pick(name, t, index);
    if (!o) {
      specs.push_back(spec_of(name, t));
      continue;
    }
    const std::string module = name.substr(0, name.size() - 7);  // less ".weight"
    MemorySource source;
    add_random_module(source, module, t.shape[1], t.shape[0], *o, seed + static_cast<uint32_t>(index++));
    for (const char* suffix : {".trellis", ".suh", ".svh", ".mcg", ".mul1"})
      if (source.has(module + suffix)) specs.push_back(spec_of(module + suffix, *source.get(module + suffix)));
  }
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture / "config.json", dir / "config.json");
  std::filesystem::copy_file(fixture / "tokenizer.json", dir / "tokenizer.json");
  kiln::testing::write_file(dir / "model.safetensors", kiln::testing::build_safetensors(specs));
  return index;
}

}  // namespace kiln::exl3::test
