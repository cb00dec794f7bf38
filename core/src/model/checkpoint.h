// A Hugging Face model directory's weights: either one model.safetensors or shards listed by
// model.safetensors.index.json. Every shard is opened and cross-checked against the index at open(),
// so a later get() fails only for a name the checkpoint does not have.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"
#include "kiln/weight_format.h"
#include "model/safetensors_file.h"

namespace kiln {

class Checkpoint final : public WeightSource {
 public:
  static constexpr char kSingleFileName[] = "model.safetensors";
  static constexpr char kIndexFileName[] = "model.safetensors.index.json";

  // Prefers model.safetensors when present (as transformers does), else the index. Errors: neither file;
  // an index that is not JSON or lacks a "weight_map" object of strings; a listed shard that is missing or
  // is not a plain file name in model_dir; a tensor absent from the shard it is mapped to; a tensor stored
  // in a shard the index does not map it to (a tensor in two shards, or one the index does not list).
  static Result<std::unique_ptr<Checkpoint>> open(const std::filesystem::path& model_dir);

  bool has(const std::string& name) const override { return location_.count(name) != 0; }
  // Missing → not found, naming the tensor and the directory.
  Result<TensorView> get(const std::string& name) const override;
  // get() plus a shape check; a mismatch names the tensor, its file, and both shapes.
  Result<TensorView> get_checked(const std::string& name, std::initializer_list<int64_t> expected_shape) const;
  // Every tensor name, in lexicographic order.
  std::vector<std::string> names() const;
  const std::filesystem::path& directory() const { return dir_; }
  // The files behind the checkpoint (one, or the shards in the index's order of first mention).
  std::vector<std::filesystem::path> files() const;

 private:
  Checkpoint(std::filesystem::path dir, std::vector<SafetensorsFile> shards);
  static Result<std::unique_ptr<Checkpoint>> open_sharded(const std::filesystem::path& dir);

  std::filesystem::path dir_;
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string, size_t> location_;  // tensor name → index into shards_
};

}  // namespace kiln
