// Metrics the server measures itself (latencies as clients see them, outcomes by finish reason), rendered
// together with the engine's gauges and counters as Prometheus text (names prefixed "kiln:", like vLLM's "vllm:").
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_api.h"

namespace kiln {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // `# TYPE` line, cumulative buckets with `le`, _sum and _count.
  void render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
  void observe_request_latency(double seconds) { e2e_.observe(seconds); }
  // finish_reason: stop, length, abort, error (tool calls count as stop).
  void count_finished(const std::string& finish_reason);
  void count_rejected(int http_status);

  std::string render(const EngineMetrics& engine, const std::string& model_name, int64_t in_flight) const;

 private:
  Histogram ttft_, itl_, e2e_;
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> finished_;
  std::map<int, uint64_t> rejected_;
};

}  // namespace kiln
