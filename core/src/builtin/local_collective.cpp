#include "builtin/local_collective.h"

#include <cstring>
#include <string>

#include "kiln/device_context.h"

namespace kiln::builtin {
namespace {

// World size 1: reductions are the identity; gathers and scatters copy in → out (on the device's stream when the
// buffers are device memory, through the DeviceContext the engine lends it).
class LocalCollective final : public Collective {
 public:
  explicit LocalCollective(DeviceContext* device) : device_(device) {}
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

  Status copy(const void* in, void* out, int64_t count, DType dtype, Stream stream) {
    KILN_RETURN_IF_ERROR(check_count(count));
    if (in == out || count == 0) return ok_status();
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    if (stream.device.is_cpu()) {
      std::memmove(out, in, bytes);
      return ok_status();
    }
    if (!device_ || !(device_->device() == stream.device))
      return failed_precondition("collective `local` on " + stream.device.to_string() +
                                 " was created without that device's context");
    return device_->copy(out, in, bytes, false);
  }

  DeviceContext* device_;
};

}  // namespace

Result<std::unique_ptr<Collective>> create_local_collective(const CreateContext& ctx) {
  return std::unique_ptr<Collective>(new LocalCollective(ctx.device_context));
}

}  // namespace kiln::builtin
