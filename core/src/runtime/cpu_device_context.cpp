#include "runtime/cpu_device_context.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace kiln {

void CpuDeviceContext::Free::operator()(void* p) const { std::free(p); }

Result<void*> CpuDeviceContext::allocate(size_t bytes, const char* what) {
  constexpr size_t kAlign = 256;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(kAlign, rounded);
  if (rounded != 0 && p == nullptr)
    return resource_exhausted("out of host memory allocating " + std::to_string(bytes) + " bytes for " +
                              (what ? what : "a buffer"));
  if (p) std::memset(p, 0, rounded);
  blocks_.emplace_back(p);
  bytes_ += rounded;
  return p;
}

Status CpuDeviceContext::copy(void* dst, const void* src, size_t bytes, bool) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return invalid_argument("host copy with a null pointer");
  if (bytes > 0) std::memmove(dst, src, bytes);
  return ok_status();
}

}  // namespace kiln
