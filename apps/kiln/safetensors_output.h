// Writes .safetensors files for `kiln quantize`: tensors gathered from several places (the input checkpoint's
// mapping, per-tensor partial files, converted biases) streamed into one file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::cli {

struct OutputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // {} = 0-dim
  const void* data = nullptr;  // nbytes() bytes, alive until written
  size_t nbytes() const;
};

// Tensors in the given order, header space-padded to 8 bytes. Written to `<path>.tmp` and renamed, so a killed run
// never leaves a truncated file under the final name (the resume logic trusts any file that exists).
Status write_safetensors(const std::filesystem::path& path, const std::vector<OutputTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// The bytes a file of these tensors will take (for sharding).
uint64_t tensor_bytes(const std::vector<OutputTensor>& tensors);

}  // namespace kiln::cli
