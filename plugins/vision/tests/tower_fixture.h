// The tower fixtures (tests/data/tower-*, made by tools/make_vision_tower_fixtures.py) as the CPU and GPU tower tests
// read them: config, weights, transformers' reference outputs and the synthetic pixel_values they were made from.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tensor_file.h"
#include "vision_config.h"
#include "vision_test_support.h"
#include "vision_weights.h"

namespace kiln::vision::testing {

// tools/make_vision_tower_fixtures.py pixel_values(): integers mapped to [-1, 1], double then float.
inline std::vector<float> synthetic_pixels(int64_t patches, int64_t patch_dim, int64_t seed) {
  std::vector<float> v(static_cast<size_t>(patches * patch_dim));
  for (int64_t p = 0; p < patches; ++p)
    for (int64_t j = 0; j < patch_dim; ++j)
      v[p * patch_dim + j] =
          static_cast<float>(static_cast<double>((p * 7919 + j * 104729 + seed * 31) % 2001) / 1000.0 - 1.0);
  return v;
}

struct TowerFixture {
  VisionConfig config;
  VisionWeights weights;
  CheckpointTensors reference;
  int64_t seed = 0;
};

inline TowerFixture load_fixture(const std::string& name) {
  TowerFixture f;
  const auto dir = data_dir() / name;
  std::ifstream in(dir / "config.json");
  auto config = parse_vision_config(nlohmann::json::parse(in));
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  f.config = *config;
  auto tensors = CheckpointTensors::open(dir);
  EXPECT_TRUE(tensors.ok()) << tensors.status().to_string();
  auto weights = load_vision_weights(*tensors, f.config);
  EXPECT_TRUE(weights.ok()) << weights.status().to_string();
  f.weights = std::move(weights).value();
  auto ref = CheckpointTensors::open_file(dir / "reference.safetensors");
  EXPECT_TRUE(ref.ok()) << ref.status().to_string();
  f.reference = std::move(ref).value();
  return f;
}

inline std::vector<std::array<int64_t, 3>> read_grids(const CheckpointTensors& ref, const std::string& name) {
  const StoredTensor* t = ref.find(name);
  std::vector<std::array<int64_t, 3>> grids;
  if (t == nullptr || t->dtype != "I32") return grids;
  std::vector<int32_t> v((t->end - t->begin) / 4);
  std::ifstream in(t->file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t->begin));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  for (size_t i = 0; i + 2 < v.size(); i += 3) grids.push_back({v[i], v[i + 1], v[i + 2]});
  return grids;
}

inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return worst / scale;
}

// The three tower fixtures with the seed of their pixel_values, as parameters of a tower test, and their test names.
using TowerCase = std::pair<std::string, int64_t>;
inline auto tower_fixture_cases() {
  return ::testing::Values(TowerCase{"tower-e2e", 5101}, TowerCase{"tower-heads4", 5202},
                           TowerCase{"tower-heads3", 5303});
}
inline std::string tower_fixture_name(const ::testing::TestParamInfo<TowerCase>& info) {
  std::string n = info.param.first;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

}  // namespace kiln::vision::testing
