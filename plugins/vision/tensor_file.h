// The checkpoint's tensors the vision tower needs, read from its safetensors files (model.safetensors, or the
// shards model.safetensors.index.json lists) as fp32. The core loads only the text model, so the plugin reads its
// own part: headers are parsed up front (cheap, enough to check names and shapes), data is read on request.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::vision {

struct StoredTensor {
  std::filesystem::path file;
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets in the file
  uint64_t end = 0;
};

class CheckpointTensors {
 public:
  // Reads the headers of the folder's safetensors files; errors name the file.
  static Result<CheckpointTensors> open(const std::filesystem::path& dir);
  // One safetensors file.
  static Result<CheckpointTensors> open_file(const std::filesystem::path& file);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, StoredTensor>& tensors() const { return tensors_; }
  const StoredTensor* find(const std::string& name) const;
  // The tensor as fp32, after checking its shape is `shape`.
  Result<std::vector<float>> read(const std::string& name, const std::vector<int64_t>& shape) const;
  // Only checks that the tensor exists with `shape` and a dtype read() converts.
  Status check(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  std::map<std::string, StoredTensor> tensors_;
};

}  // namespace kiln::vision
