#include "model/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

namespace kiln {
namespace {

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

bool shape_equals(const TensorView& view, std::initializer_list<int64_t> dims) {
  if (view.rank != static_cast<int>(dims.size())) return false;
  return std::equal(dims.begin(), dims.end(), view.shape.begin());
}

}  // namespace

Checkpoint::Checkpoint(std::filesystem::path dir, std::vector<SafetensorsFile> shards)
    : dir_(std::move(dir)), shards_(std::move(shards)) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    for (const std::string& name : shards_[i].names()) location_.emplace(name, i);
  }
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::filesystem::path& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return not_found("model directory " + model_dir.string() + " does not exist or is not a directory");
  }
  const std::filesystem::path single = model_dir / kSingleFileName;
  if (std::filesystem::exists(single, ec)) {
    KILN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single));
    std::vector<SafetensorsFile> shards;
    shards.push_back(std::move(file));
    return std::unique_ptr<Checkpoint>(new Checkpoint(model_dir, std::move(shards)));
  }
  if (std::filesystem::exists(model_dir / kIndexFileName, ec)) return open_sharded(model_dir);
  return not_found(model_dir.string() + " has neither " + kSingleFileName + " nor " + kIndexFileName);
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_sharded(const std::filesystem::path& dir) {
  const std::filesystem::path index_path = dir / kIndexFileName;
  const std::string where = index_path.string();
  std::ifstream in(index_path);
  if (!in) return unavailable("cannot read " + where);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return data_loss(where + ": not valid JSON: " + e.what());
  }
  if (!index.is_object()) return data_loss(where + ": must be a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return data_loss(where + ": missing \"weight_map\" object (tensor name → shard file)");
  }

  // Shards in order of first mention, so files() is stable and follows the index.
  std::vector<std::string> shard_names;
  std::map<std::string, size_t> shard_slot;
  std::vector<std::pair<std::string, size_t>> mapped;  // tensor → shard slot, as the index claims
  for (const auto& [tensor, shard_value] : map_it->items()) {
    if (!shard_value.is_string()) {
      return data_loss(where + ": weight_map entry for tensor '" + tensor + "' must be a file name string");
    }
    const std::string shard = shard_value.get<std::string>();
    const std::filesystem::path shard_path(shard);
    // Shards live beside the index; anything else (absolute paths, "..", subdirectories) is not a checkpoint
    // the HF format can produce and could point outside the model directory.
    if (shard.empty() || shard_path.has_parent_path() || shard == "." || shard == "..") {
      return data_loss(where + ": tensor '" + tensor + "' is mapped to '" + shard +
                       "', which is not a file name in the model directory");
    }
    auto [it, inserted] = shard_slot.emplace(shard, shard_names.size());
    if (inserted) shard_names.push_back(shard);
    mapped.emplace_back(tensor, it->second);
  }

  std::vector<SafetensorsFile> shards;
  shards.reserve(shard_names.size());
  for (const std::string& shard : shard_names) {
    const std::filesystem::path shard_path = dir / shard;
    std::error_code ec;
    if (!std::filesystem::exists(shard_path, ec)) {
      return not_found(where + ": lists shard " + shard + ", but " + shard_path.string() + " does not exist");
    }
    KILN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path));
    shards.push_back(std::move(file));
  }

  for (const auto& [tensor, slot] : mapped) {
    if (!shards[slot].has(tensor)) {
      return data_loss(where + ": maps tensor '" + tensor + "' to " + shard_names[slot] +
                       ", but that shard does not contain it");
    }
  }
  // Every stored tensor must be where the index says; this also catches one tensor stored in two shards.
  std::map<std::string, size_t> claimed(mapped.begin(), mapped.end());
  for (size_t slot = 0; slot < shards.size(); ++slot) {
    for (const std::string& tensor : shards[slot].names()) {
      const auto it = claimed.find(tensor);
      if (it == claimed.end()) {
        return data_loss(where + ": shard " + shard_names[slot] + " contains tensor '" + tensor +
                         "', which the index does not list");
      }
      if (it->second != slot) {
        return data_loss(where + ": tensor '" + tensor + "' is stored in shard " + shard_names[slot] +
                         " but the index maps it to " + shard_names[it->second] +
                         " (a tensor must live in exactly one shard)");
      }
    }
  }
  return std::unique_ptr<Checkpoint>(new Checkpoint(dir, std::move(shards)));
}

Result<TensorView> Checkpoint::get(const std::string& name) const {
  const auto it = location_.find(name);
  if (it == location_.end()) return not_found("tensor '" + name + "' not found in checkpoint " + dir_.string());
  return shards_[it->second].get(name);
}

Result<TensorView> Checkpoint::get_checked(const std::string& name,
                                           std::initializer_list<int64_t> expected_shape) const {
  KILN_ASSIGN_OR_RETURN(TensorView view, get(name));
  if (!shape_equals(view, expected_shape)) {
    return invalid_argument("tensor '" + name + "' in " + shards_[location_.at(name)].path().string() + " has shape " +
                            view.shape_string() + ", expected " + shape_text(expected_shape) +
                            " from the model config");
  }
  return view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(location_.size());
  for (const auto& [name, slot] : location_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::filesystem::path> Checkpoint::files() const {
  std::vector<std::filesystem::path> out;
  out.reserve(shards_.size());
  for (const SafetensorsFile& shard : shards_) out.push_back(shard.path());
  return out;
}

}  // namespace kiln
