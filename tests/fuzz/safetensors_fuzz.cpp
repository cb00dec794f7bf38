// A .safetensors file → SafetensorsFile::open (header length, JSON header, dtypes, shapes, offsets), then every
// tensor it accepts is read end to end: a validated header must never point outside the mapping, and every view is
// aligned to its element size (misaligned tensors are served from aligned copies), so typed reads are defined.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.h"
#include "model/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const auto file = fuzz::scratch_file(std::string_view(reinterpret_cast<const char*>(data), size), ".safetensors");
  auto opened = SafetensorsFile::open(file);
  if (!opened.ok()) return 0;
  for (const auto& name : opened->names()) {
    auto view = opened->get(name);
    fuzz::check(view.ok(), "a listed tensor can be read");
    const auto* bytes = static_cast<const unsigned char*>(view->data);
    unsigned sum = 0;
    for (size_t i = 0; i < view->nbytes(); ++i) sum += bytes[i];
    (void)sum;
    fuzz::check(view->nbytes() == 0 || reinterpret_cast<uintptr_t>(view->data) % dtype_size(view->dtype) == 0,
                "a view is aligned to its element size");
  }
  return 0;
}
