// Fixture access shared by the tokenizer tests (tests/data/tokenizer, written by tools/make_tokenizer.py).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace kiln::testing {

inline std::filesystem::path tokenizer_data_dir() {
  return std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "data" / "tokenizer";
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline nlohmann::ordered_json read_json(const std::string& name) {
  return nlohmann::ordered_json::parse(read_text(tokenizer_data_dir() / name));
}

inline const Tokenizer& fixture_tokenizer() {
  static const Tokenizer tokenizer = [] {
    auto loaded = Tokenizer::load(tokenizer_data_dir() / "tokenizer.json");
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().to_string();
      std::abort();
    }
    return std::move(loaded).value();
  }();
  return tokenizer;
}

}  // namespace kiln::testing
