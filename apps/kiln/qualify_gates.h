// The gates of `kiln qualify`: what a candidate recipe's server must do right before it serves users. Each gate
// sends its requests over HTTP, as a client would, and records every request and answer in the transcript.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "serve_client.h"

namespace kiln::cli {

struct GateResult {
  std::string name;
  enum class Outcome { kPass, kFail, kSkipped } outcome = Outcome::kFail;
  int64_t passed = 0, total = 0;
  std::string reason;                                // why it failed or was skipped
  bool not_run = false;                              // skipped by choice or by an earlier failure, not as inapplicable
  nlohmann::json details = nlohmann::json::array();  // one entry per case

  // Pass when every case passed; the reason then names the first that did not.
  void finish();
  const char* outcome_text() const;
  nlohmann::json to_json() const;
};

struct GateSettings {
  int64_t json_requests = 20;  // strict-JSON requests
  int64_t tool_requests = 20;  // tool-call requests, spread over the five kinds
  int64_t tool_depth = 0;      // prompt tokens of the long-context tool call
  std::vector<int64_t> needle_depths;
  bool images = false;  // the recipe has an image modality
  std::string image_skip_reason;
  bool thinking = false;  // chat_template_kwargs.enable_thinking
  int timeout_s = 600;    // per request
};

class GateClient {
 public:
  GateClient(ServerAddress server, std::string model, const GateSettings& settings, std::ofstream& transcript)
      : server_(std::move(server)), model_(std::move(model)), settings_(settings), transcript_(transcript) {}

  // POST (streamed when body.stream is true), logged to the transcript under `gate`.
  JsonReply call(const std::string& gate, const std::string& path, nlohmann::json body);
  // A chat request's common fields: the model, greedy sampling, `max_tokens`, thinking on or off.
  nlohmann::json chat(const nlohmann::json& messages, int64_t max_tokens) const;
  // About `tokens` tokens of filler words (measured once against this server: tokens per word).
  std::string filler(int64_t tokens, std::mt19937_64& rng);
  const GateSettings& settings() const { return settings_; }

 private:
  ServerAddress server_;
  std::string model_;
  const GateSettings& settings_;
  std::ofstream& transcript_;
  double tokens_per_word_ = 0;
};

// "400: <the server's message>" for a refused request, the transport error for no answer.
std::string reply_failure(const JsonReply& r);

GateResult gate_smoke(GateClient& c);
GateResult gate_strict_json(GateClient& c);
GateResult gate_tools(GateClient& c);
GateResult gate_responses(GateClient& c);
GateResult gate_needle(GateClient& c);
GateResult gate_images(GateClient& c);

}  // namespace kiln::cli
