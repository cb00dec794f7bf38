// What the libFuzzer harnesses share: the fixture tokenizer (GLM's special tokens, small vocabulary) and a
// scratch file for parsers that only read from disk.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace kiln::fuzz {

inline const Tokenizer& fixture_tokenizer() {
  static const Tokenizer tokenizer = [] {
    auto loaded = Tokenizer::load(std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/tokenizer/tokenizer.json");
    if (!loaded.ok()) {
      std::cerr << loaded.status().to_string() << "\n";
      std::abort();
    }
    return std::move(loaded).value();
  }();
  return tokenizer;
}

// Writes `bytes` to this process's scratch file (one per process, so parallel fuzzing jobs do not share it,
// removed at exit) and returns its path.
inline std::filesystem::path scratch_file(std::string_view bytes, const std::string& extension) {
  struct ScratchDir {
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("kiln-fuzz-" + std::to_string(::getpid()));
    ScratchDir() { std::filesystem::create_directories(path); }
    ~ScratchDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const ScratchDir dir;
  const auto file = dir.path / ("input" + extension);
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return file;
}

// Aborts (a crash libFuzzer reports, with the input) when an invariant does not hold.
inline void check(bool condition, const char* what) {
  if (!condition) {
    std::cerr << "invariant violated: " << what << "\n";
    std::abort();
  }
}

}  // namespace kiln::fuzz
