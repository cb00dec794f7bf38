#include "tensor_file.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln::vision {
namespace {

namespace fs = std::filesystem;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

float bf16_value(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f16_value(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0 && man == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: shift the mantissa up to an implicit 1
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3FFu) << 13);
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status read_header(const fs::path& file, std::map<std::string, StoredTensor>& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file.string() + ": cannot be opened");
  uint64_t header_size = 0;
  if (!in.read(reinterpret_cast<char*>(&header_size), 8)) return invalid_argument(file.string() + ": truncated");
  std::error_code ec;
  const uint64_t file_size = fs::file_size(file, ec);
  if (ec || header_size > file_size - 8 || header_size > (100u << 20))
    return invalid_argument(file.string() + ": not a safetensors file (header of " + std::to_string(header_size) +
                            " bytes)");
  std::string text(header_size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_size)))
    return invalid_argument(file.string() + ": truncated header");
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (!header.is_object()) return invalid_argument(file.string() + ": the header is not a JSON object");
  const uint64_t data_start = 8 + header_size;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      StoredTensor t;
      t.file = file;
      t.dtype = entry.value("dtype", "");
      const auto& offsets = entry.at("data_offsets");
      t.begin = data_start + offsets.at(0).get<uint64_t>();
      t.end = data_start + offsets.at(1).get<uint64_t>();
      for (const auto& d : entry.at("shape")) t.shape.push_back(d.get<int64_t>());
      if (t.end < t.begin || t.end > file_size)
        return invalid_argument(file.string() + ": tensor " + name + " lies outside the file");
      out[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(file.string() + ": malformed safetensors header (" + e.what() + ")");
  }
  return ok_status();
}

}  // namespace

Result<CheckpointTensors> CheckpointTensors::open(const fs::path& dir) {
  CheckpointTensors c;
  std::error_code ec;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(single, ec)) {
    KILN_RETURN_IF_ERROR(read_header(single, c.tensors_));
    return c;
  }
  if (!fs::is_regular_file(index, ec))
    return not_found(dir.string() + " holds neither model.safetensors nor model.safetensors.index.json");
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return invalid_argument(index.string() + ": no weight_map");
  std::map<std::string, bool> files;
  for (const auto& [name, file] : j["weight_map"].items())
    if (file.is_string()) files[file.get<std::string>()] = true;
  for (const auto& [file, unused] : files) KILN_RETURN_IF_ERROR(read_header(dir / file, c.tensors_));
  return c;
}

Result<CheckpointTensors> CheckpointTensors::open_file(const fs::path& file) {
  CheckpointTensors c;
  KILN_RETURN_IF_ERROR(read_header(file, c.tensors_));
  return c;
}

const StoredTensor* CheckpointTensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status CheckpointTensors::check(const std::string& name, const std::vector<int64_t>& shape) const {
  const StoredTensor* t = find(name);
  if (t == nullptr) return not_found("the checkpoint has no tensor " + name);
  if (t->shape != shape)
    return invalid_argument(name + " is " + shape_text(t->shape) + " in the checkpoint; the vision config makes it " +
                            shape_text(shape));
  const int64_t bytes = dtype_bytes(t->dtype);
  if (bytes == 0) return unimplemented(name + " is stored as " + t->dtype + "; the vision tower reads F32, BF16, F16");
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (static_cast<uint64_t>(count * bytes) != t->end - t->begin)
    return invalid_argument(name + ": its data size does not match its shape and dtype");
  return ok_status();
}

Result<std::vector<float>> CheckpointTensors::read(const std::string& name, const std::vector<int64_t>& shape) const {
  KILN_RETURN_IF_ERROR(check(name, shape));
  const StoredTensor& t = *find(name);
  std::vector<char> raw(t.end - t.begin);
  std::ifstream in(t.file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t.begin));
  if (!in.read(raw.data(), static_cast<std::streamsize>(raw.size())))
    return invalid_argument(t.file.string() + ": cannot read " + name);
  const int64_t bytes = dtype_bytes(t.dtype);
  std::vector<float> out(raw.size() / static_cast<size_t>(bytes));
  if (t.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, raw.data() + 2 * i, 2);
      out[i] = t.dtype == "BF16" ? bf16_value(v) : f16_value(v);
    }
  }
  return out;
}

}  // namespace kiln::vision
