#include "server/server_metrics.h"

#include <cstdio>

namespace kiln {
namespace {

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void render_scalar(std::string& out, const std::string& name, const char* type, const std::string& help,
                   const std::string& labels, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + "{" + labels + "} " + format_number(value) + "\n";
}

// Seconds; TTFT spans prefill of up to 1M-token prompts, hence the long tail.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                         0.075, 0.1,    0.15,  0.2,    0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0};
const std::vector<double> kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard lock(mutex_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    std::string le = i < bounds_.size() ? format_number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + format_number(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics() : ttft_(kTtftBuckets), itl_(kItlBuckets), e2e_(kE2eBuckets) {
  // Present from the start so dashboards see zeros rather than missing series.
  for (const char* reason : {"stop", "length", "abort", "error"}) finished_[reason] = 0;
}

void ServerMetrics::count_finished(const std::string& finish_reason) {
  std::lock_guard lock(mutex_);
  ++finished_[finish_reason];
}

void ServerMetrics::count_rejected(int http_status) {
  std::lock_guard lock(mutex_);
  ++rejected_[http_status];
}

std::string ServerMetrics::render(const EngineMetrics& e, const std::string& model_name, int64_t in_flight) const {
  const std::string labels = "model_name=\"" + escape_label(model_name) + "\"";
  std::string out;
  render_scalar(out, "kiln:num_requests_running", "gauge", "Requests in the running batch.", labels,
                static_cast<double>(e.requests_running));
  render_scalar(out, "kiln:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", labels,
                static_cast<double>(e.requests_waiting));
  render_scalar(out, "kiln:http_requests_in_flight", "gauge", "Generation requests the HTTP server is serving.", labels,
                static_cast<double>(in_flight));
  double usage = e.kv_blocks_total > 0 ? static_cast<double>(e.kv_blocks_used) / e.kv_blocks_total : 0.0;
  render_scalar(out, "kiln:kv_cache_usage_ratio", "gauge", "Fraction of KV-cache blocks in use (0..1).", labels, usage);
  int64_t capacity = e.kv_blocks_total * e.kv_block_size;
  render_scalar(out, "kiln:kv_cache_capacity_tokens", "gauge", "Tokens the KV-cache pool holds.", labels,
                static_cast<double>(capacity));
  render_scalar(out, "kiln:kv_cache_capacity_windows", "gauge",
                "Complete max_model_len windows the KV-cache pool holds.", labels,
                e.max_model_len > 0 ? static_cast<double>(capacity) / e.max_model_len : 0.0);
  render_scalar(out, "kiln:prompt_tokens_total", "counter", "Prompt tokens processed.", labels,
                static_cast<double>(e.prompt_tokens_total));
  render_scalar(out, "kiln:generation_tokens_total", "counter", "Tokens generated.", labels,
                static_cast<double>(e.generation_tokens_total));
  render_scalar(out, "kiln:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                labels, static_cast<double>(e.prefix_cache_queries));
  render_scalar(out, "kiln:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", labels,
                static_cast<double>(e.prefix_cache_hits));
  render_scalar(out, "kiln:num_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.", labels,
                static_cast<double>(e.preemptions_total));
  // Speculative decoding (vLLM's spec_decode_* names): acceptance rate = accepted / draft tokens, mean
  // acceptance length = 1 + accepted / drafts, and acceptance per draft position.
  render_scalar(out, "kiln:spec_decode_num_drafts_total", "counter", "Verification passes that carried drafts.", labels,
                static_cast<double>(e.spec_drafts));
  render_scalar(out, "kiln:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", labels,
                static_cast<double>(e.spec_draft_tokens));
  render_scalar(out, "kiln:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", labels,
                static_cast<double>(e.spec_accepted_tokens));
  render_scalar(out, "kiln:spec_decode_bound_limited_steps_total", "counter",
                "Steps where the model runner's batch-invariance bound made drafting shallower than the depth, or "
                "turned it off.",
                labels, static_cast<double>(e.spec_bound_limited_steps));
  out += "# HELP kiln:spec_decode_num_accepted_tokens_per_pos_total Draft tokens accepted, by draft position.\n"
         "# TYPE kiln:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t p = 0; p < e.spec_accepted_per_pos.size(); ++p)
    out += "kiln:spec_decode_num_accepted_tokens_per_pos_total{" + labels + ",position=\"" + std::to_string(p) +
           "\"} " + std::to_string(e.spec_accepted_per_pos[p]) + "\n";
  out += "# HELP kiln:spec_decode_num_draft_tokens_per_pos_total Draft tokens proposed, by draft position.\n"
         "# TYPE kiln:spec_decode_num_draft_tokens_per_pos_total counter\n";
  for (size_t p = 0; p < e.spec_drafted_per_pos.size(); ++p)
    out += "kiln:spec_decode_num_draft_tokens_per_pos_total{" + labels + ",position=\"" + std::to_string(p) +
           "\"} " + std::to_string(e.spec_drafted_per_pos[p]) + "\n";
  {
    std::lock_guard lock(mutex_);
    out += "# HELP kiln:request_success_total Finished requests by finish reason.\n";
    out += "# TYPE kiln:request_success_total counter\n";
    for (const auto& [reason, n] : finished_) {
      out +=
          "kiln:request_success_total{" + labels + ",finished_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    }
    out += "# HELP kiln:request_rejected_total Requests refused before generation, by HTTP status.\n";
    out += "# TYPE kiln:request_rejected_total counter\n";
    for (const auto& [status, n] : rejected_) {
      out += "kiln:request_rejected_total{" + labels + ",status=\"" + std::to_string(status) + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  ttft_.render(out, "kiln:time_to_first_token_seconds", "Time from request arrival to the first generated token.",
               labels);
  itl_.render(out, "kiln:inter_token_latency_seconds", "Time between consecutive generated tokens of a request.",
              labels);
  e2e_.render(out, "kiln:e2e_request_latency_seconds", "Time from request arrival to its last token.", labels);
  return out;
}

}  // namespace kiln
