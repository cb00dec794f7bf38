// Ranks as threads of one process (CPU tensor parallelism): a group of W endpoints over host memory. Every
// reduction adds the ranks' values in rank order 0, 1, …, W−1 in fp32 on every rank, so all ranks get the same
// bits whatever order their threads arrive in. Each call is a rendezvous of all W ranks (two barriers); a rank that
// fails between calls aborts the group so the others return an error instead of waiting for it forever.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/collective.h"

namespace kiln::builtin {

class InprocGroup {
 public:
  explicit InprocGroup(int world);
  int world() const { return world_; }
  // Rank `rank`'s end of the group (the group must outlive it).
  std::unique_ptr<Collective> endpoint(int rank);
  // Wakes every rank waiting in a call and fails every call until reset(), with `why` in the message.
  void abort(const std::string& why);
  // Re-arms an aborted group; only while no rank is inside a call.
  void reset();

  // What the endpoints run (each a rendezvous of all ranks).
  Status all_reduce(int rank, void* buffer, int64_t count, DType dtype, ReduceOp op);
  Status all_gather(int rank, const void* in, void* out, int64_t count, DType dtype);
  Status reduce_scatter(int rank, const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  Status broadcast(int rank, void* buffer, int64_t count, DType dtype, int root);

 private:
  // Posts this rank's operands, then waits until every rank has posted (or the group is aborted).
  Status post_and_wait(int rank, const void* in, void* out, int64_t count, DType dtype, int op_code);
  Status wait_all();
  // Every rank posted the same call (the same count, dtype and operation), or the error all ranks return.
  Status check_posts(const char* call) const;

  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
  struct Post {
    const void* in = nullptr;
    void* out = nullptr;
    int64_t count = 0;
    DType dtype = DType::kF32;
    int op = 0;
  };
  std::vector<Post> posts_;
};

}  // namespace kiln::builtin
