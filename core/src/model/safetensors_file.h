// One .safetensors file, memory-mapped read-only. The header is validated completely at open(), so get()
// can only fail for a name that is not there; views point straight into the mapping.
// Format: u64 little-endian header length N, N bytes of JSON header, then the data region that every
// tensor's data_offsets [begin, end) are relative to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

class SafetensorsFile {
 public:
  // The reference implementation's limit; a larger header is corrupt or hostile.
  static constexpr uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;

  // Errors (all naming the file, and the tensor where there is one): file missing or shorter than 8 bytes,
  // header length past the end of the file or above kMaxHeaderBytes, header not a JSON object, duplicate
  // tensor names, an entry without a valid dtype/shape/data_offsets, an unsupported dtype, a byte size that
  // differs from numel·dtype_size, offsets past the data region (truncated file), overlapping tensors.
  static Result<SafetensorsFile> open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::filesystem::path& path() const { return file_.path(); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A contiguous CPU view into the read-only mapping, valid while this object lives. Not found → error.
  Result<TensorView> get(const std::string& name) const;
  // Tensor names in lexicographic order.
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }
  // The header's optional "__metadata__" string map (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    DType dtype = DType::kF32;
    int rank = 0;
    std::array<int64_t, kMaxTensorRank> shape{};
    uint64_t begin = 0;  // byte offsets relative to the data region
    uint64_t end = 0;
  };

  explicit SafetensorsFile(MappedFile file) : file_(std::move(file)) {}
  Status parse_header();

  MappedFile file_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln
