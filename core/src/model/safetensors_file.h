// One .safetensors file, memory-mapped read-only. The header is validated completely at open(), so get()
// can only fail for a name that is not there; views point straight into the mapping.
// Format: u64 little-endian header length N, N bytes of JSON header, then the data region that every
// tensor's data_offsets [begin, end) are relative to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
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
  // A contiguous CPU view, valid while this object lives. Not found → error. The view points into the read-only
  // mapping, except for a tensor whose bytes do not start at a multiple of its element size (the format does not
  // require it; a writer that does not sort tensors by element size leaves them so): reading such a tensor through
  // a typed pointer is undefined, so its bytes are copied once, on its first get(), into aligned memory this object
  // owns, and the view points there. (An empty tensor's view may stay unaligned: nothing is read through it.)
  Result<TensorView> get(const std::string& name) const;
  // How many tensors get() serves from an aligned copy (misaligned in the file).
  size_t misaligned_count() const { return misaligned_; }
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
    bool misaligned = false;  // its bytes in the mapping are not aligned to dtype_size(dtype)
  };

  explicit SafetensorsFile(MappedFile file) : file_(std::move(file)) {}
  Status parse_header();

  MappedFile file_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  size_t misaligned_ = 0;
  // Aligned copies of misaligned tensors, made on first get(); vectors of uint64_t so their storage is 8-byte
  // aligned (the largest element size) and does not move when this object does. Guarded for concurrent loaders.
  mutable std::map<std::string, std::vector<uint64_t>> aligned_copies_;
  mutable std::unique_ptr<std::mutex> copies_mutex_ = std::make_unique<std::mutex>();
};

}  // namespace kiln
