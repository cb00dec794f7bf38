#include "model/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

namespace kiln {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";

std::optional<DType> dtype_from_name(const std::string& name) {
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F32") return DType::kF32;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "I8") return DType::kI8;
  if (name == "I16") return DType::kI16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON integer ≥ 0 (nlohmann stores non-negative literals as unsigned).
std::optional<uint64_t> as_unsigned(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  return std::nullopt;
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  KILN_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  SafetensorsFile file(std::move(mapped));
  KILN_RETURN_IF_ERROR(file.parse_header());
  return file;
}

Status SafetensorsFile::parse_header() {
  const std::string where = path().string();
  const uint64_t file_size = file_.size();
  if (file_size < 8) {
    return data_loss(where + ": " + std::to_string(file_size) +
                     " bytes is too short for a safetensors file (needs an 8-byte header length)");
  }
  const uint64_t header_len = read_u64_le(file_.data());
  if (header_len > kMaxHeaderBytes) {
    return data_loss(where + ": header length " + std::to_string(header_len) + " exceeds the " +
                     std::to_string(kMaxHeaderBytes) + "-byte limit; the file is corrupt or not safetensors");
  }
  if (header_len > file_size - 8) {
    return data_loss(where + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                     std::to_string(file_size) + " bytes); the file is truncated or not safetensors");
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  // nlohmann keeps the last of two equal keys silently; two entries for one tensor name must be an error.
  std::set<std::string> seen_names;
  std::string duplicate;
  const json::parser_callback_t reject_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen_names.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(file_.data() + 8);
  json header;
  try {
    header = json::parse(text, text + header_len, reject_duplicates);
  } catch (const json::exception& e) {
    return data_loss(where + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return data_loss(where + ": header must be a JSON object, got " + header.type_name());
  if (!duplicate.empty()) return data_loss(where + ": tensor '" + duplicate + "' appears twice in the header");

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) return data_loss(where + ": __metadata__ must be an object of strings");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) {
          return data_loss(where + ": __metadata__ entry '" + key + "' must be a string, got " +
                           text_value.type_name());
        }
        metadata_[key] = text_value.get<std::string>();
      }
      continue;
    }
    const std::string tensor = where + ": tensor '" + name + "'";
    if (!value.is_object()) return data_loss(tensor + ": entry must be an object");

    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) return data_loss(tensor + ": missing string 'dtype'");
    const std::string dtype_text = dtype_it->get<std::string>();
    const std::optional<DType> dtype = dtype_from_name(dtype_text);
    if (!dtype) {
      return unimplemented(tensor + ": dtype '" + dtype_text +
                           "' is not supported (supported: BF16, F16, F32, F8_E4M3, I8, I16, I32, I64, U8)");
    }

    Entry entry;
    entry.dtype = *dtype;
    const auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) return data_loss(tensor + ": missing array 'shape'");
    if (shape_it->size() > static_cast<size_t>(kMaxTensorRank)) {
      return unimplemented(tensor + ": rank " + std::to_string(shape_it->size()) + " exceeds kiln's maximum of " +
                           std::to_string(kMaxTensorRank));
    }
    uint64_t numel = 1;
    bool numel_overflow = false;
    for (const json& dim_value : *shape_it) {
      const std::optional<uint64_t> dim = as_unsigned(dim_value);
      if (!dim || *dim > static_cast<uint64_t>(INT64_MAX)) {
        return data_loss(tensor + ": shape entries must be non-negative integers, got " + shape_it->dump());
      }
      entry.shape[entry.rank++] = static_cast<int64_t>(*dim);
      numel_overflow |= __builtin_mul_overflow(numel, *dim, &numel);
    }

    const auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !as_unsigned((*offsets_it)[0]) || !as_unsigned((*offsets_it)[1])) {
      return data_loss(tensor + ": 'data_offsets' must be two non-negative integers [begin, end]");
    }
    entry.begin = (*offsets_it)[0].get<uint64_t>();
    entry.end = (*offsets_it)[1].get<uint64_t>();
    const std::string range = "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ")";
    if (entry.end < entry.begin) return data_loss(tensor + ": data_offsets " + range + " end before they begin");
    uint64_t expected_bytes = 0;
    if (numel_overflow || __builtin_mul_overflow(numel, dtype_size(entry.dtype), &expected_bytes) ||
        expected_bytes != entry.end - entry.begin) {
      return data_loss(tensor + ": data_offsets " + range + " hold " + std::to_string(entry.end - entry.begin) +
                       " bytes but shape " + shape_it->dump() + " of " + dtype_text + " needs " +
                       (numel_overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)));
    }
    if (entry.end > data_size) {
      return data_loss(tensor + ": data_offsets " + range + " extend past the data region (" +
                       std::to_string(data_size) + " bytes); the file is truncated or the header is wrong");
    }
    // The mapping starts on a page, so a tensor's address is aligned exactly when its file offset is.
    entry.misaligned = (data_start_ + entry.begin) % dtype_size(entry.dtype) != 0 && entry.end > entry.begin;
    misaligned_ += entry.misaligned ? 1 : 0;
    tensors_.emplace(name, entry);
  }

  // Sorted by start, a tensor overlaps another exactly when it starts before its predecessor ends.
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, entry] : tensors_) {
    if (entry.end > entry.begin) by_offset.emplace_back(&name, &entry);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [prev_name, prev] = by_offset[i - 1];
    const auto& [name, entry] = by_offset[i];
    if (entry->begin < prev->end) {
      return data_loss(where + ": tensor '" + *name + "' (bytes " + std::to_string(entry->begin) + ".." +
                       std::to_string(entry->end) + ") overlaps tensor '" + *prev_name + "' (bytes " +
                       std::to_string(prev->begin) + ".." + std::to_string(prev->end) + ")");
    }
  }
  return ok_status();
}

Result<TensorView> SafetensorsFile::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found(path().string() + ": no tensor '" + name + "'");
  const Entry& entry = it->second;
  TensorView view;
  // The mapping is PROT_READ; TensorView's pointer is non-const only because the SDK type is shared with
  // writable storage.
  const uint8_t* bytes = file_.data() + data_start_ + entry.begin;
  if (entry.misaligned) {
    const std::lock_guard<std::mutex> lock(*copies_mutex_);
    auto [copy, inserted] = aligned_copies_.try_emplace(name);
    if (inserted) {
      const uint64_t size = entry.end - entry.begin;
      copy->second.resize((size + 7) / 8);
      std::memcpy(copy->second.data(), bytes, size);
    }
    bytes = reinterpret_cast<const uint8_t*>(copy->second.data());
  }
  view.data = const_cast<uint8_t*>(bytes);
  view.dtype = entry.dtype;
  view.device = Device::cpu();
  view.rank = entry.rank;
  view.shape = entry.shape;
  int64_t stride = 1;
  for (int k = entry.rank - 1; k >= 0; --k) {
    view.strides[k] = stride;
    stride *= entry.shape[k];
  }
  return view;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

}  // namespace kiln
