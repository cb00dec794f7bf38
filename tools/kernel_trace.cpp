// kernel_trace: where a process's GPU time goes, kernel by kernel, without nsys.
//
// A CUDA injection library (the driver loads it into any CUDA process named by CUDA_INJECTION64_PATH and calls
// InitializeInjection) that records every kernel's start and end through CUPTI's activity API and, at exit, prints a
// table per kernel name: launches, total and mean time, share of all kernel time. kiln bench's stage timer says which
// stage is slow; this says which launches inside it are. Not part of the build: CUPTI is not a Debian package here,
// it comes from the nvidia-cuda-cupti wheel (the same one torch ships), matched to the driver's CUDA major version.
//
//   pip download --no-deps "nvidia-cuda-cupti==13.0.*" && unzip -q nvidia_cuda_cupti-*.whl   # -> nvidia/cu13/
//   g++ -O2 -shared -fPIC -std=c++20 -Invidia/cu13/include -I/usr/local/cuda/include tools/kernel_trace.cpp \
//       -Lnvidia/cu13/lib -l:libcupti.so.13 -Wl,-rpath,'$ORIGIN' -o libkernel_trace.so
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KILN_TRACE_OUT=trace.md kiln bench prefill ...
//
// KILN_TRACE_OUT: the table's file (default: stderr). KILN_TRACE_MIN_US: leave out kernels whose total is below it.
// KILN_TRACE_SKIP_UNTIL: count only kernels launched after the first one whose name contains this string (e.g. a
// kernel that only the measured phase runs), so loading and warm-up stay out of the table.
//
// Below the table, the GPU's idle time inside the span: the gaps between consecutive activities (kernels, copies,
// memsets; a gap is measured from the latest end so far) by size, and the largest gaps with what ran before and
// after them — launch gaps between back-to-back kernels are a few µs; a host synchronisation or a host-side stall
// shows as a large gap, often after a device-to-host copy.
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct Totals {
  uint64_t launches = 0, ns = 0;
};

struct Interval {
  uint64_t start, end;
  std::string name;
};

std::mutex g_mu;
std::map<std::string, Totals>* g_totals = nullptr;  // leaked on purpose: exit order across libraries is unknown
std::string* g_skip_until = nullptr;
bool g_counting = true;
uint64_t g_first_start = 0, g_last_end = 0;
std::vector<Interval>* g_timeline = nullptr;  // every counted activity, for the gaps

std::string demangled(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : name;
  std::free(d);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  // Template arguments make names unreadably long; keep the function and the first 60 characters of its arguments.
  const size_t lt = s.find('<');
  if (lt != std::string::npos && s.size() > lt + 60) s = s.substr(0, lt + 60) + "…>";
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  // Records arrive in completion order per buffer; the skip marker is judged by start time below.
  std::vector<Interval> acts;
  std::vector<bool> is_kernel;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      acts.push_back({k->start, k->end, demangled(k->name)});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      acts.push_back({m->start, m->end, std::string("[memcpy ") + copy_kind(m->copyKind) + " " +
                                            std::to_string(m->bytes) + " B]"});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      acts.push_back({m->start, m->end, "[memset " + std::to_string(m->bytes) + " B]"});
    }
  }
  std::sort(acts.begin(), acts.end(), [](auto& a, auto& b) { return a.start < b.start; });
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (Interval& a : acts) {
      if (!g_counting && a.name.find(*g_skip_until) != std::string::npos) g_counting = true;
      if (!g_counting) continue;
      if (a.name[0] != '[') {  // the table counts kernels only
        Totals& t = (*g_totals)[a.name];
        ++t.launches;
        t.ns += a.end - a.start;
      }
      if (g_first_start == 0 || a.start < g_first_start) g_first_start = a.start;
      g_last_end = std::max<uint64_t>(g_last_end, a.end);
      g_timeline->push_back(std::move(a));
    }
  }
  std::free(buffer);
}

// The idle time between activities: a histogram of the gaps and the largest ones with their neighbours.
void report_gaps(FILE* out) {
  std::vector<Interval>& t = *g_timeline;
  std::sort(t.begin(), t.end(), [](auto& a, auto& b) { return a.start < b.start; });
  struct Gap {
    uint64_t ns;
    size_t before, after;
  };
  std::vector<Gap> gaps;
  uint64_t reach = 0;
  size_t reach_at = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (i > 0 && t[i].start > reach) gaps.push_back({t[i].start - reach, reach_at, i});
    if (t[i].end > reach) reach = t[i].end, reach_at = i;
  }
  const double bins_us[] = {1, 2, 5, 10, 100, 1000, 1e18};
  uint64_t count[7] = {}, sum[7] = {}, idle = 0;
  for (const Gap& g : gaps) {
    idle += g.ns;
    int b = 0;
    while (g.ns / 1e3 >= bins_us[b]) ++b;
    ++count[b], sum[b] += g.ns;
  }
  std::fprintf(out, "\nGPU idle inside the span: %.3f ms in %zu gaps\n\n| gap | gaps | total ms |\n|---|---|---|\n",
               idle / 1e6, gaps.size());
  const char* labels[] = {"< 1 us", "1-2 us", "2-5 us", "5-10 us", "10-100 us", "0.1-1 ms", ">= 1 ms"};
  for (int b = 0; b < 7; ++b)
    if (count[b]) std::fprintf(out, "| %s | %llu | %.3f |\n", labels[b], (unsigned long long)count[b], sum[b] / 1e6);
  std::sort(gaps.begin(), gaps.end(), [](auto& a, auto& b) { return a.ns > b.ns; });
  std::fprintf(out, "\n| largest gaps, us | at ms | after | before |\n|---|---|---|---|\n");
  for (size_t i = 0; i < std::min<size_t>(gaps.size(), 16); ++i)
    std::fprintf(out, "| %.1f | %.3f | %s | %s |\n", gaps[i].ns / 1e3, (t[gaps[i].after].start - g_first_start) / 1e6,
                 t[gaps[i].before].name.c_str(), t[gaps[i].after].name.c_str());
}

void report() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::pair<std::string, Totals>> rows(g_totals->begin(), g_totals->end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ns > b.second.ns; });
  uint64_t all = 0;
  for (auto& r : rows) all += r.second.ns;
  const char* path = std::getenv("KILN_TRACE_OUT");
  FILE* out = path ? std::fopen(path, "w") : stderr;
  if (!out) out = stderr;
  const char* min_env = std::getenv("KILN_TRACE_MIN_US");
  const double min_us = min_env ? std::atof(min_env) : 0.0;
  std::fprintf(out, "kernel time %.3f ms over a span of %.3f ms, %zu kernel names\n\n", all / 1e6,
               (g_last_end - g_first_start) / 1e6, rows.size());
  std::fprintf(out, "| kernel | launches | total ms | mean us | share |\n|---|---|---|---|---|\n");
  for (auto& [name, t] : rows) {
    if (t.ns / 1e3 < min_us) continue;
    std::fprintf(out, "| %s | %llu | %.3f | %.2f | %.1f %% |\n", name.c_str(), static_cast<unsigned long long>(t.launches),
                 t.ns / 1e6, t.ns / 1e3 / t.launches, all ? 100.0 * t.ns / all : 0.0);
  }
  report_gaps(out);
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  g_totals = new std::map<std::string, Totals>();
  g_timeline = new std::vector<Interval>();
  const char* skip = std::getenv("KILN_TRACE_SKIP_UNTIL");
  g_skip_until = new std::string(skip ? skip : "");
  g_counting = g_skip_until->empty();
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
    return 1;
  }
  std::atexit(report);
  return 1;
}
