#include "kernels/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kiln::cpu {

void topk_indices(const float* values, int64_t n, int64_t k, int32_t* out) {
  k = std::min(k, n);
  if (k <= 0) return;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // A strict total order (value desc, NaN last, index asc) makes the selected set and its order unique.
  auto before = [values](int32_t a, int32_t b) {
    const float va = values[a], vb = values[b];
    const bool na = std::isnan(va), nb = std::isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + k, before);
  std::copy(order.begin(), order.begin() + k, out);
}

void torch_cpu_topk_indices(const float* values, int64_t n, int64_t k, int32_t* out) {
  k = std::min(k, n);
  if (k <= 0) return;
  using Entry = std::pair<float, int64_t>;
  std::vector<Entry> queue(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[j] = {values[j], j};
  // torch's comparator (aten/native TopKImpl.h, largest): by value alone, NaN first. Same algorithms, same input
  // order: the same entries end up in front.
  auto greater = [](const Entry& x, const Entry& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), greater);
    std::sort(queue.begin(), queue.begin() + (k - 1), greater);
  }
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int32_t>(queue[j].second);
}

}  // namespace kiln::cpu
