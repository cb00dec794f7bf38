#include "builtin/local_collective.h"

#include <cstring>
#include <string>

namespace kiln::builtin {
namespace {

class LocalCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }

  Status all_reduce(void*, int64_t count, DType, ReduceOp, Stream) override { return check_count(count); }

  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override {
    return copy(in, out, count, dtype, stream);
  }

  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp, Stream stream) override {
    return copy(in, out, count, dtype, stream);
  }

  Status broadcast(void*, int64_t count, DType, int root, Stream) override {
    if (root != 0)
      return out_of_range("collective `local`: broadcast root " + std::to_string(root) + " does not exist (world size 1)");
    return check_count(count);
  }

 private:
  static Status check_count(int64_t count) {
    if (count < 0) return invalid_argument("collective `local`: negative element count " + std::to_string(count));
    return ok_status();
  }

  static Status copy(const void* in, void* out, int64_t count, DType dtype, Stream stream) {
    KILN_RETURN_IF_ERROR(check_count(count));
    if (in == out || count == 0) return ok_status();
    if (!stream.device.is_cpu())
      return unimplemented("collective `local` copies on the CPU only for now (stream on " + stream.device.to_string() + ")");
    std::memmove(out, in, static_cast<size_t>(count) * dtype_size(dtype));
    return ok_status();
  }
};

}  // namespace

Result<std::unique_ptr<Collective>> create_local_collective(const CreateContext&) {
  return std::unique_ptr<Collective>(new LocalCollective());
}

}  // namespace kiln::builtin
