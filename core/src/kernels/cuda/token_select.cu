#include <cooperative_groups.h>

#include <climits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/token_select.h"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
// Blocks per row: a handful of rows must still keep several SMs busy on a 150k vocabulary (the exp passes are bound
// by fp64 throughput), and 8 is the portable cluster size.
constexpr int kCluster = 8;
constexpr int kBuckets = 256;  // one 8-bit digit of a radix select
constexpr int kNone = INT_MAX;
constexpr int kAssembleThreads = 128;

// Order-preserving key (as in topk.cu): larger float → larger key; NaN → 0, below −inf; −0 and +0 equal.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// A prefix of a row in (key descending, index ascending) order — the order of cpu::topk_indices: the elements whose
// key is above `key`, and those equal to it up to `index`.
struct Cut {
  uint32_t key;
  int index;
};
// NaN keys are 0, so this is the whole row, NaN included, as the CPU's candidate lists are.
constexpr Cut kWholeRow{0u, kNone};

__device__ __forceinline__ bool in_cut(uint32_t key, int i, Cut c) {
  return key > c.key || (key == c.key && i <= c.index);
}

struct Best {
  float v;
  int i;  // −1: none
};

struct BestOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
  }
};

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Elements and their fixed-point weight in a radix bucket.
struct CountMass {
  long long count;
  unsigned long long mass;
  __device__ CountMass operator+(const CountMass& o) const { return {count + o.count, mass + o.mass}; }
};

// One block's contribution to a cluster-wide combination, read by its peers through distributed shared memory.
struct Slot {
  unsigned long long mass[kBuckets];
  int count[kBuckets];
  double sum;
  Best best;
  int n;
  int index;
};

struct Selected {
  int bucket;  // −1: none
  CountMass own, above;
};

struct Shared {
  Slot slots[2];
  union {
    cub::BlockReduce<double, kThreads>::TempStorage sum;
    cub::BlockReduce<Best, kThreads>::TempStorage best;
    cub::BlockReduce<int, kThreads>::TempStorage index;
    cub::BlockScan<double, kThreads>::TempStorage scan_d;
    cub::BlockScan<int, kThreads>::TempStorage scan_i;
    cub::BlockScan<CountMass, kThreads>::TempStorage scan_cm;
  } temp;
  Selected selected;
  double total;
  int q_ids[cpu::kMaxQWidth];  // a draft's q sorted by id (select), or a row's candidates (sample_drafts)
  float q_probs[cpu::kMaxQWidth];
};

// The blocks of a cluster share a row. An exchange publishes every block's slot (filled before it), after which each
// block reads its peers' in rank order, so all of them combine identical values identically. Slots alternate: one is
// refilled only after the next exchange's barrier, which no block passes before it has read the previous one.
class Cluster {
 public:
  __device__ explicit Cluster(Shared& sh) : sh_(sh) {}
  __device__ int rank() const { return static_cast<int>(cg::cluster_group::block_rank()); }
  __device__ Slot& mine() { return sh_.slots[turn_ & 1]; }
  __device__ void exchange() { cg::cluster_group::sync(); }
  __device__ const Slot& peer(int r) { return *cg::cluster_group::map_shared_rank(&sh_.slots[turn_ & 1], r); }
  __device__ void done() { ++turn_; }
  __device__ void sync() { cg::cluster_group::sync(); }
  template <class T>
  __device__ T* rank0(T* local) {
    return cg::cluster_group::map_shared_rank(local, 0);
  }

 private:
  Shared& sh_;
  int turn_ = 0;
};

// This block's part of a row: chunk [lo, hi) of the vocabulary.
struct RowPart {
  const float* row;
  int vocab;
  long long lo, hi;
  int rank;
};

__device__ RowPart row_part(const float* row, int64_t vocab, int rank) {
  const long long chunk = (vocab + kCluster - 1) / kCluster;
  const long long lo = min(rank * chunk, static_cast<long long>(vocab));
  return {row, static_cast<int>(vocab), lo, min(lo + chunk, static_cast<long long>(vocab)), rank};
}

// The elements of the block's chunk, spread across threads (coalesced), in increasing index within a thread.
template <class F>
__device__ __forceinline__ void for_striped(const RowPart& p, F f) {
  long long i = p.lo + threadIdx.x;
  for (; i + 3 * kThreads < p.hi; i += 4 * kThreads) {
    const float v0 = p.row[i], v1 = p.row[i + kThreads], v2 = p.row[i + 2 * kThreads], v3 = p.row[i + 3 * kThreads];
    f(static_cast<int>(i), v0);
    f(static_cast<int>(i + kThreads), v1);
    f(static_cast<int>(i + 2 * kThreads), v2);
    f(static_cast<int>(i + 3 * kThreads), v3);
  }
  for (; i < p.hi; i += kThreads) f(static_cast<int>(i), p.row[i]);
}

// A contiguous segment of the block's chunk per thread, for the passes that need index order across threads.
struct Segment {
  long long lo, hi;
};

__device__ Segment segment(const RowPart& p) {
  const long long per = (p.hi - p.lo + kThreads - 1) / kThreads;
  const long long lo = min(p.lo + threadIdx.x * per, p.hi);
  return {lo, min(lo + per, p.hi)};
}

__device__ Best cluster_argmax(const RowPart& p, Shared& sh, Cluster& c) {
  Best b{0.f, -1};
  for_striped(p, [&](int i, float v) {
    if (!isnan(v)) b = BestOp()(b, Best{v, i});
  });
  const Best block = cub::BlockReduce<Best, kThreads>(sh.temp.best).Reduce(b, BestOp());
  if (threadIdx.x == 0) c.mine().best = block;
  c.exchange();
  Best all{0.f, -1};
  for (int r = 0; r < kCluster; ++r) all = BestOp()(all, c.peer(r).best);
  c.done();
  return all;
}

// w(v) = exp(v / T − max / T), formed as cpu::sampling_distribution forms it: 1/T, then two roundings (the _rn
// intrinsics are never contracted into a fused multiply-add).
struct Weights {
  double inv_t, max_scaled;
  __device__ double operator()(float v) const {
    return exp(__dsub_rn(__dmul_rn(static_cast<double>(v), inv_t), max_scaled));
  }
};

__device__ Weights weights(const RowPart& p, float temperature, Best best) {
  const double inv_t = 1.0 / static_cast<double>(temperature);
  return {inv_t, __dmul_rn(static_cast<double>(p.row[best.i < 0 ? 0 : best.i]), inv_t)};
}

// Σ w over the members of `cut`, identical in every block of the cluster.
__device__ double cluster_weight_sum(const RowPart& p, Cut cut, const Weights& w, Shared& sh, Cluster& c) {
  double part = 0.0;
  for_striped(p, [&](int i, float v) {
    if (in_cut(order_key(v), i, cut)) part += w(v);
  });
  const double block = cub::BlockReduce<double, kThreads>(sh.temp.sum).Sum(part);
  if (threadIdx.x == 0) c.mine().sum = block;
  c.exchange();
  double total = 0.0;
  for (int r = 0; r < kCluster; ++r) total += c.peer(r).sum;
  c.done();
  return total;
}

// The index of the n-th (from 1) element, in index order, whose key is `key` and that is a member of `within`.
__device__ int nth_tie(const RowPart& p, uint32_t key, Cut within, long long n, Shared& sh, Cluster& c) {
  auto tie = [&](long long i) {
    const uint32_t k = order_key(p.row[i]);
    return k == key && in_cut(k, static_cast<int>(i), within);
  };
  const Segment seg = segment(p);
  int count = 0;
  for (long long i = seg.lo; i < seg.hi; ++i) count += tie(i);
  int before, block_count;
  cub::BlockScan<int, kThreads>(sh.temp.scan_i).ExclusiveSum(count, before, block_count);
  if (threadIdx.x == 0) c.mine().n = block_count;
  c.exchange();
  long long seen = before;
  for (int r = 0; r < p.rank; ++r) seen += c.peer(r).n;
  c.done();
  Slot& found = c.mine();
  if (threadIdx.x == 0) found.index = -1;
  __syncthreads();
  if (seen < n && n <= seen + count) {
    for (long long i = seg.lo; i < seg.hi; ++i) {
      if (tie(i) && ++seen == n) {
        found.index = static_cast<int>(i);
        break;
      }
    }
  }
  c.exchange();
  int index = -1;
  for (int r = 0; r < kCluster; ++r) index = max(index, c.peer(r).index);
  c.done();
  return index;
}

// Among equal-key ties of fixed-point weight f each (count of them, mass = count · f), how many a nucleus needs after
// `above`: the fewest t ≥ 1 with above + t · f ≥ target, as cpu::sampling_distribution keeps a token while the mass
// before it is below top_p.
__device__ long long nucleus_ties(unsigned long long above, CountMass ties, double target) {
  const unsigned long long f = ties.mass / static_cast<unsigned long long>(ties.count);
  if (f == 0) return 1;
  auto reaches = [&](long long t) { return static_cast<double>(above + t * f) >= target; };
  long long t = static_cast<long long>(ceil((target - static_cast<double>(above)) / static_cast<double>(f)));
  t = max(1LL, min(t, ties.count));
  while (t > 1 && reaches(t - 1)) --t;
  while (t < ties.count && !reaches(t)) ++t;
  return t;
}

struct Selection {
  Cut cut;
  bool whole;         // mass mode: `within` never reaches top_p (rounding), so all of it is kept
  double within_sum;  // mass mode: Σ w over `within`, as cluster_weight_sum computes it
};

// A prefix of `within`, in (key descending, index ascending) order. Count mode (kMass false): its first k members
// (1 ≤ k ≤ |within|), the top-k rule. Mass mode: the shortest prefix whose weight reaches top_p of within's, the
// cpu::sampling_distribution nucleus. Four passes of 8-bit histograms, from the top digit, find the key at the cut;
// nth_tie then finds the index among the elements of that key. Weights are summed in fixed point with as many fraction
// bits as a vocabulary of them leaves in 64 bits (44 at 150k): integer sums are exact in any order, so the
// shared-memory atomics that build the histograms stay deterministic, and the cut moves only where the mass before it
// is within about 1e-9 of top_p.
template <bool kMass>
__device__ Selection radix_select(const RowPart& p, Cut within, long long k, float top_p, const Weights& w, Shared& sh,
                                  Cluster& c) {
  const double scale = ldexp(1.0, 62 - (32 - __clz(p.vocab)));
  uint32_t prefix = 0;
  CountMass above{0, 0};
  double target = 0.0;
  double within_sum = 0.0;
  Selected chosen{};
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    const uint32_t mask = level == 0 ? 0u : ~0u << (shift + 8);
    Slot& mine = c.mine();
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) {
      mine.count[b] = 0;
      mine.mass[b] = 0;
    }
    __syncthreads();
    double part = 0.0;
    for_striped(p, [&](int i, float v) {
      const uint32_t key = order_key(v);
      if ((key & mask) != prefix || !in_cut(key, i, within)) return;
      const int digit = (key >> shift) & 0xff;
      atomicAdd(&mine.count[digit], 1);
      if constexpr (kMass) {
        const double wi = w(v);
        part += wi;
        atomicAdd(&mine.mass[digit], __double2ull_rn(wi * scale));
      }
    });
    if (kMass && level == 0) {
      const double block = cub::BlockReduce<double, kThreads>(sh.temp.sum).Sum(part);
      if (threadIdx.x == 0) mine.sum = block;
    }
    c.exchange();
    // Thread t holds bucket 255 − t, so an inclusive scan over threads runs from the largest keys down.
    CountMass own{0, 0};
    if (threadIdx.x < kBuckets) {
      for (int r = 0; r < kCluster; ++r) {
        const Slot& s = c.peer(r);
        own.count += s.count[kBuckets - 1 - threadIdx.x];
        own.mass += s.mass[kBuckets - 1 - threadIdx.x];
      }
    }
    if (kMass && level == 0)
      for (int r = 0; r < kCluster; ++r) within_sum += c.peer(r).sum;
    c.done();
    CountMass incl, all;
    cub::BlockScan<CountMass, kThreads>(sh.temp.scan_cm).InclusiveSum(own, incl, all);
    if (kMass && level == 0) target = static_cast<double>(top_p) * static_cast<double>(all.mass);
    if (threadIdx.x == 0) sh.selected.bucket = -1;
    __syncthreads();
    if (threadIdx.x < kBuckets && own.count > 0) {
      const CountMass before{above.count + incl.count - own.count, above.mass + incl.mass - own.mass};
      bool hit;
      if constexpr (kMass) {
        // The first non-empty bucket whose running mass reaches the target; everything above it stays below.
        hit = static_cast<double>(before.mass + own.mass) >= target &&
              (before.count == 0 || static_cast<double>(before.mass) < target);
      } else {
        hit = before.count < k && k <= before.count + own.count;
      }
      if (hit) sh.selected = {kBuckets - 1 - static_cast<int>(threadIdx.x), own, before};
    }
    __syncthreads();
    chosen = sh.selected;
    if (chosen.bucket < 0) return {within, true, within_sum};  // only at level 0 of mass mode
    prefix |= static_cast<uint32_t>(chosen.bucket) << shift;
    above = chosen.above;
  }
  // `chosen.own` now counts the members whose key is exactly `prefix`: equal values, hence equal weights.
  const long long take = kMass ? nucleus_ties(above.mass, chosen.own, target) : k - above.count;
  Cut cut{prefix, 0};
  if (take == chosen.own.count)
    cut.index = prefix == within.key ? within.index : kNone;
  else
    cut.index = nth_tie(p, prefix, within, take, sh, c);
  return {cut, false, within_sum};
}

// A sampled row's distribution (cpu::sampling_distribution): p(i) = float(w(i) / kept_total) inside `kept`, else 0.
struct RowDist {
  Weights w;
  Cut kept;
  double kept_total;
  __device__ float prob(int i, float v) const {
    return in_cut(order_key(v), i, kept) ? static_cast<float>(w(v) / kept_total) : 0.0f;
  }
};

__device__ RowDist row_distribution(const RowPart& p, const cpu::SelectParams& sp, Best best, Shared& sh, Cluster& c) {
  const Weights w = weights(p, sp.temperature, best);
  Cut top_k = kWholeRow;
  if (sp.top_k > 0 && sp.top_k < p.vocab) top_k = radix_select<false>(p, kWholeRow, sp.top_k, 0.0f, w, sh, c).cut;
  if (sp.top_p < 1.0f) {
    const Selection nucleus = radix_select<true>(p, top_k, 0, sp.top_p, w, sh, c);
    if (nucleus.whole) return {w, top_k, nucleus.within_sum};
    return {w, nucleus.cut, cluster_weight_sum(p, nucleus.cut, w, sh, c)};
  }
  return {w, top_k, cluster_weight_sum(p, top_k, w, sh, c)};
}

// A draft's q into shared memory as (id, probability) sorted by id (ties by slot; ids outside [0, vocab) dropped), so
// a thread can walk it alongside its segment of the vocabulary. Returns the number of entries.
__device__ int load_q(const cpu::SelectArgs& a, long long q_row, int draft, Shared& sh) {
  if (!a.q_ids) {
    if (threadIdx.x == 0) {
      sh.q_ids[0] = draft;
      sh.q_probs[0] = 1.0f;
    }
    __syncthreads();
    return draft >= 0 && draft < a.vocab ? 1 : 0;
  }
  const int width = static_cast<int>(a.q_width);
  int id = kNone;
  float prob = 0.0f;
  if (threadIdx.x < width) {
    id = a.q_ids[q_row * width + threadIdx.x];
    prob = a.q_probs[q_row * width + threadIdx.x];
    if (id < 0 || id >= a.vocab) id = kNone;
    sh.q_ids[threadIdx.x] = id;
  }
  const int valid = __syncthreads_count(id != kNone);
  int rank = 0;
  if (threadIdx.x < width)
    for (int s = 0; s < width; ++s)
      rank += sh.q_ids[s] < id || (sh.q_ids[s] == id && s < static_cast<int>(threadIdx.x));
  __syncthreads();
  if (threadIdx.x < width) {
    sh.q_ids[rank] = id;
    sh.q_probs[rank] = prob;
  }
  __syncthreads();
  return valid;
}

// q(x) from the sorted list: the first entry of id x, or 0.
__device__ float q_of(int x, int q_count, const Shared& sh) {
  int lo = 0, hi = q_count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sh.q_ids[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < q_count && sh.q_ids[lo] == x ? sh.q_probs[lo] : 0.0f;
}

// A draw from the row's p (residual false) or from max(p − q, 0) (residual true) with uniform u, as
// cpu::sample_from_distribution_u: the first index whose running sum exceeds u · total, else the last nonzero one.
// Each thread sums a contiguous segment; the thread whose segment carries the running sum past the target walks it
// again. Returns false, writing nothing, when the distribution has no mass; otherwise one thread of the cluster writes
// the index to *out.
__device__ bool cluster_draw(const RowPart& p, const RowDist& d, bool residual, int q_count, double u, int32_t* out,
                             Shared& sh, Cluster& c) {
  const Segment seg = segment(p);
  int q_start = 0;
  if (residual)
    while (q_start < q_count && sh.q_ids[q_start] < seg.lo) ++q_start;
  auto value = [&](long long i, int& q) {
    const float pi = d.prob(static_cast<int>(i), p.row[i]);
    if (!residual) return pi;
    while (q < q_count && sh.q_ids[q] < i) ++q;
    if (q == q_count || sh.q_ids[q] != i) return pi;
    const float r = pi - sh.q_probs[q];
    return r < 0.0f ? 0.0f : r;  // std::max(p − q, 0.0f)
  };
  double sum = 0.0;
  int last = -1;
  int q = q_start;
  for (long long i = seg.lo; i < seg.hi; ++i) {
    const float v = value(i, q);
    if (v > 0.0f) {
      sum += v;
      last = static_cast<int>(i);
    }
  }
  double before, block_sum;
  cub::BlockScan<double, kThreads>(sh.temp.scan_d).ExclusiveSum(sum, before, block_sum);
  __syncthreads();
  const int block_last = cub::BlockReduce<int, kThreads>(sh.temp.index).Reduce(last, MaxOp());
  if (threadIdx.x == 0) {
    c.mine().sum = block_sum;
    c.mine().index = block_last;
  }
  c.exchange();
  double earlier = 0.0, total = 0.0;
  int last_all = -1;
  for (int r = 0; r < kCluster; ++r) {
    const Slot& s = c.peer(r);
    if (r < p.rank) earlier += s.sum;
    total += s.sum;
    last_all = max(last_all, s.index);
  }
  c.done();
  if (total == 0.0) return false;
  const double target = u * total;
  const double start = earlier + before;
  const bool crosses = sum > 0.0 && start + sum > target;
  const int first =
      cub::BlockReduce<int, kThreads>(sh.temp.index).Reduce(crosses ? static_cast<int>(threadIdx.x) : kNone, MinOp());
  if (threadIdx.x == 0) c.mine().n = first;
  c.exchange();
  int winner = -1;
  for (int r = kCluster - 1; r >= 0; --r)
    if (c.peer(r).n != kNone) winner = r;
  const int first_thread = c.mine().n;
  c.done();
  if (winner == p.rank && static_cast<int>(threadIdx.x) == first_thread) {
    double running = start;
    int pick = -1;
    q = q_start;
    for (long long i = seg.lo; i < seg.hi; ++i) {
      const float v = value(i, q);
      if (v <= 0.0f) continue;
      running += v;
      pick = static_cast<int>(i);
      if (running > target) break;
    }
    *out = pick;  // the crossing, or this segment's last nonzero when rounding falls short of the sum that claimed it
  }
  if (winner < 0 && p.rank == 0 && threadIdx.x == 0) *out = last_all;
  return true;
}

// K, held to max_drafts: the device cannot report a sequence with more (the CPU reference rejects it).
__device__ int drafts_of(const cpu::SelectSeq& seq, int64_t max_drafts) {
  return seq.num_drafts < 0 ? 0 : static_cast<int>(min(static_cast<int64_t>(seq.num_drafts), max_drafts));
}

// What a (sequence, row) contributes; select_assemble_kernel turns a sequence's rows into its tokens.
struct RowResult {
  int32_t accept;  // rows before the last: the draft was accepted
  int32_t token;   // emitted if the sequence stops at this row (argmax, correction or bonus); −1 if not needed
};

// One cluster per (sequence, row slot); slots beyond a sequence's drafts return at once.
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    select_rows_kernel(const cpu::SelectArgs a, RowResult* __restrict__ results) {
  __shared__ Shared sh;
  const long long slot = blockIdx.x / kCluster;
  const long long width = a.max_drafts + 1;
  const cpu::SelectSeq seq = a.seqs[slot / width];
  const int j = static_cast<int>(slot % width);
  const int k = drafts_of(seq, a.max_drafts);
  if (j > k) return;
  Cluster c(sh);
  const RowPart p = row_part(a.logits + (static_cast<long long>(seq.first_row) + j) * a.vocab, a.vocab, c.rank());
  const Best best = cluster_argmax(p, sh, c);
  const int draft = j < k ? a.drafts[seq.draft_offset + j] : -1;
  RowResult* out = results + slot;
  const bool lead = p.rank == 0 && threadIdx.x == 0;
  if (seq.params.temperature <= 0.0f || seq.params.top_k == 1) {
    const int token = best.i < 0 ? 0 : best.i;
    if (lead) *out = {j < k && draft == token, token};
  } else {
    const RowDist d = row_distribution(p, seq.params, best, sh, c);
    const double* u = a.uniforms + seq.u_offset;
    bool accept = false;
    int q_count = 0;
    if (j < k) {
      q_count = load_q(a, seq.draft_offset + j, draft, sh);
      const float px = draft >= 0 && draft < p.vocab ? d.prob(draft, p.row[draft]) : 0.0f;
      const double qx = a.q_ids ? static_cast<double>(q_of(draft, q_count, sh)) : 1.0;
      accept = u[j] * qx < static_cast<double>(px);
    }
    if (lead) {
      out->accept = accept;
      if (accept) out->token = -1;
    }
    if (!accept && !cluster_draw(p, d, j < k, q_count, u[k], &out->token, sh, c))
      cluster_draw(p, d, false, 0, u[k], &out->token, sh, c);  // no residual mass: draw from p
  }
  c.sync();  // a block's shared memory must outlive its peers' reads of it
}

__global__ void __launch_bounds__(kAssembleThreads)
    select_assemble_kernel(const cpu::SelectArgs a, const RowResult* __restrict__ results) {
  const long long s = static_cast<long long>(blockIdx.x) * kAssembleThreads + threadIdx.x;
  if (s >= a.num_seqs) return;
  const cpu::SelectSeq seq = a.seqs[s];
  const long long width = a.max_drafts + 1;
  const int k = drafts_of(seq, a.max_drafts);
  const RowResult* rows = results + s * width;
  int32_t* out = a.tokens + s * width;
  int n = 0;
  while (n < k && rows[n].accept) {
    out[n] = a.drafts[seq.draft_offset + n];
    ++n;
  }
  out[n] = rows[n].token;
  for (long long i = n + 1; i < width; ++i) out[i] = -1;
  a.accepted[s] = n;
}

// The members of `cut`, in index order, into rank 0's q_ids (at most kMaxQWidth of them).
__device__ void gather_to_rank0(const RowPart& p, Cut cut, Shared& sh, Cluster& c) {
  const Segment seg = segment(p);
  int count = 0;
  for (long long i = seg.lo; i < seg.hi; ++i) count += in_cut(order_key(p.row[i]), static_cast<int>(i), cut);
  int before, block_count;
  cub::BlockScan<int, kThreads>(sh.temp.scan_i).ExclusiveSum(count, before, block_count);
  if (threadIdx.x == 0) c.mine().n = block_count;
  c.exchange();
  int at = before;
  for (int r = 0; r < p.rank; ++r) at += c.peer(r).n;
  c.done();
  int* dst = c.rank0(sh.q_ids);
  for (long long i = seg.lo; i < seg.hi && at < cpu::kMaxQWidth; ++i)
    if (in_cut(order_key(p.row[i]), static_cast<int>(i), cut)) dst[at++] = static_cast<int>(i);
  c.sync();  // the writes land before rank 0 reads them
}

// One cluster per row: the argmax, or the top-C candidates gathered into rank 0, which forms q and draws.
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    draft_rows_kernel(const cpu::DraftSampleArgs a) {
  __shared__ Shared sh;
  Cluster c(sh);
  const long long r = blockIdx.x / kCluster;
  const RowPart p = row_part(a.logits + r * a.vocab, a.vocab, c.rank());
  const int width = static_cast<int>(a.q_width);
  int32_t* q_ids = a.q_ids + r * width;
  float* q_probs = a.q_probs + r * width;
  const Best best = cluster_argmax(p, sh, c);
  const float temperature = a.temperatures[r];
  if (temperature <= 0.0f) {
    if (p.rank == 0) {
      for (int i = threadIdx.x; i < width; i += kThreads) {
        q_ids[i] = -1;
        q_probs[i] = 0.0f;
      }
      if (threadIdx.x == 0) a.tokens[r] = best.i < 0 ? 0 : best.i;
    }
    c.sync();
    return;
  }
  const Weights w = weights(p, temperature, best);
  const Cut cut = width < p.vocab ? radix_select<false>(p, kWholeRow, width, 0.0f, w, sh, c).cut : kWholeRow;
  gather_to_rank0(p, cut, sh, c);
  if (p.rank != 0) return;  // no peer reads this block's shared memory any more

  const int n = min(width, p.vocab);
  const int t = threadIdx.x;
  const int id = t < n ? sh.q_ids[t] : -1;
  const double wi = t < n ? w(p.row[id]) : 0.0;
  const double total = cub::BlockReduce<double, kThreads>(sh.temp.sum).Sum(wi);
  if (t == 0) sh.total = total;
  __syncthreads();
  const float q = t < n ? static_cast<float>(wi / sh.total) : 0.0f;
  if (t < width) {
    q_ids[t] = id;
    q_probs[t] = q;
  }
  double running, q_total;
  cub::BlockScan<double, kThreads>(sh.temp.scan_d).InclusiveSum(static_cast<double>(q), running, q_total);
  const bool crosses = q > 0.0f && running > a.uniforms[r] * q_total;
  __syncthreads();
  const int first = cub::BlockReduce<int, kThreads>(sh.temp.index).Reduce(crosses ? t : kNone, MinOp());
  __syncthreads();
  const int last = cub::BlockReduce<int, kThreads>(sh.temp.index).Reduce(q > 0.0f ? t : -1, MaxOp());
  if (t == 0) a.tokens[r] = sh.q_ids[first != kNone ? first : last];
}

Status check_grid(int64_t rows, const char* what) {
  if (rows > INT_MAX / kCluster) return invalid_argument(std::string(what) + ": too many rows for one launch");
  return ok_status();
}

}  // namespace

size_t select_workspace_bytes(int64_t max_seqs, int64_t max_drafts) {
  if (max_seqs <= 0 || max_drafts < 0) return 0;
  return sizeof(RowResult) * static_cast<size_t>(max_seqs) * static_cast<size_t>(max_drafts + 1);
}

Status select_tokens(const cpu::SelectArgs& a, void* workspace, size_t workspace_bytes, StreamHandle stream) {
  if (a.vocab < 1 || a.vocab > INT32_MAX) return invalid_argument("cuda::select_tokens: vocab must be in [1, 2^31)");
  if (a.num_seqs < 0 || a.max_drafts < 0)
    return invalid_argument("cuda::select_tokens: num_seqs and max_drafts must be ≥ 0");
  if (a.q_ids && (!a.q_probs || a.q_width < 1 || a.q_width > cpu::kMaxQWidth))
    return invalid_argument("cuda::select_tokens: q_ids needs q_probs and 1 ≤ q_width ≤ 256");
  if (a.num_seqs == 0) return ok_status();
  if (!a.logits || !a.seqs || !a.tokens || !a.accepted || (a.max_drafts > 0 && !a.drafts))
    return invalid_argument(
        "cuda::select_tokens: logits, seqs, tokens, accepted (and drafts when max_drafts > 0) are required");
  if (a.num_seqs > INT_MAX || a.max_drafts >= INT_MAX)
    return invalid_argument("cuda::select_tokens: too many rows for one launch");
  const int64_t slots = a.num_seqs * (a.max_drafts + 1);
  KILN_RETURN_IF_ERROR(check_grid(slots, "cuda::select_tokens"));
  const size_t need = select_workspace_bytes(a.num_seqs, a.max_drafts);
  if (!workspace || workspace_bytes < need)
    return invalid_argument("cuda::select_tokens: workspace of " + std::to_string(workspace_bytes) + " bytes, need " +
                            std::to_string(need));
  auto* results = static_cast<RowResult*>(workspace);
  select_rows_kernel<<<static_cast<unsigned>(slots * kCluster), kThreads, 0, stream>>>(a, results);
  KILN_RETURN_IF_ERROR(check_launch("cuda::select_tokens (rows)"));
  select_assemble_kernel<<<blocks_for(a.num_seqs, kAssembleThreads), kAssembleThreads, 0, stream>>>(a, results);
  return check_launch("cuda::select_tokens (assemble)");
}

Status sample_drafts(const cpu::DraftSampleArgs& a, StreamHandle stream) {
  if (a.vocab < 1 || a.vocab > INT32_MAX) return invalid_argument("cuda::sample_drafts: vocab must be in [1, 2^31)");
  if (a.q_width < 1 || a.q_width > cpu::kMaxQWidth)
    return invalid_argument("cuda::sample_drafts: q_width must be in [1, 256]");
  if (a.rows < 0) return invalid_argument("cuda::sample_drafts: rows must be ≥ 0");
  if (a.rows == 0) return ok_status();
  if (!a.logits || !a.temperatures || !a.tokens || !a.q_ids || !a.q_probs)
    return invalid_argument("cuda::sample_drafts: logits, temperatures, tokens, q_ids and q_probs are required");
  KILN_RETURN_IF_ERROR(check_grid(a.rows, "cuda::sample_drafts"));
  draft_rows_kernel<<<static_cast<unsigned>(a.rows * kCluster), kThreads, 0, stream>>>(a);
  return check_launch("cuda::sample_drafts");
}

}  // namespace kiln::cuda
