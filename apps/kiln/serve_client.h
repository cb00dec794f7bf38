// A streaming OpenAI client for the benchmarks: one request, timed per chunk (TTFT, inter-token gaps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

struct ServerAddress {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
};

// Parses "http://host:port" (the scheme and a trailing /v1 are optional).
bool parse_base_url(const std::string& url, ServerAddress& out);

struct StreamTiming {
  bool ok = false;
  std::string error;
  double ttft = 0;                 // seconds from send to the first chunk carrying text
  double latency = 0;              // seconds from send to the end of the stream
  std::vector<double> itl;         // seconds between consecutive text chunks
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// POST /v1/completions with stream = true and usage; `ignore_eos` keeps output lengths fixed.
StreamTiming timed_completion(const ServerAddress& server, const std::string& model, const std::string& prompt,
                              int64_t max_tokens, bool ignore_eos);

// GET /v1/models: the first served model id ("" when the server does not answer).
std::string first_model(const ServerAddress& server);

}  // namespace kiln::cli
