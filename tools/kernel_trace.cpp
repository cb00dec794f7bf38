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

std::mutex g_mu;
std::map<std::string, Totals>* g_totals = nullptr;  // leaked on purpose: exit order across libraries is unknown
std::string* g_skip_until = nullptr;
bool g_counting = true;
uint64_t g_first_start = 0, g_last_end = 0;

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

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  // Records arrive in completion order per buffer; the skip marker is judged by start time below.
  std::vector<const CUpti_ActivityKernel10*> kernels;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
      kernels.push_back(reinterpret_cast<const CUpti_ActivityKernel10*>(record));
  }
  std::sort(kernels.begin(), kernels.end(), [](auto* a, auto* b) { return a->start < b->start; });
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const CUpti_ActivityKernel10* k : kernels) {
      std::string name = demangled(k->name);
      if (!g_counting && name.find(*g_skip_until) != std::string::npos) g_counting = true;
      if (!g_counting) continue;
      Totals& t = (*g_totals)[name];
      ++t.launches;
      t.ns += k->end - k->start;
      if (g_first_start == 0 || k->start < g_first_start) g_first_start = k->start;
      g_last_end = std::max<uint64_t>(g_last_end, k->end);
    }
  }
  std::free(buffer);
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
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  g_totals = new std::map<std::string, Totals>();
  const char* skip = std::getenv("KILN_TRACE_SKIP_UNTIL");
  g_skip_until = new std::string(skip ? skip : "");
  g_counting = g_skip_until->empty();
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
    return 1;
  }
  std::atexit(report);
  return 1;
}
