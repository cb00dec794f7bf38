#include "safetensors_output.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace kiln::cli {
namespace fs = std::filesystem;

size_t OutputTensor::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

uint64_t tensor_bytes(const std::vector<OutputTensor>& tensors) {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

Status write_safetensors(const fs::path& path, const std::vector<OutputTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors' order in the header, so the same inputs give the same bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const fs::path tmp = fs::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return internal_error("cannot write " + tmp.string());
    uint64_t n = text.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes()));
    out.flush();
    if (!out) return internal_error("writing " + tmp.string() + " failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return internal_error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  return ok_status();
}

}  // namespace kiln::cli
