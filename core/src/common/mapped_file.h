// A whole file mapped read-only into memory. Checkpoint tensors are served straight from the mapping,
// so pages are read on first touch and shared with the page cache instead of copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "kiln/status.h"

namespace kiln {

class MappedFile {
 public:
  // Errors name the path: missing file, a directory, or a failing mmap.
  static Result<MappedFile> open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Pages are mapped PROT_READ: writing through data() faults.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile(std::filesystem::path path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void unmap();

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;  // nullptr for an empty file (mmap cannot map zero bytes)
  size_t size_ = 0;
};

}  // namespace kiln
