// The OpenAI client of the benchmarks and `kiln qualify`: a streamed request timed per chunk (TTFT, inter-token
// gaps), and plain JSON / SSE requests whose whole answer the qualification gates inspect.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// POST /v1/chat/completions, streamed with usage: one user message of the images (`image_url` parts, e.g. data:
// URLs) followed by `text`. TTFT then covers the images' decoding and encoding as well as the prefill.
StreamTiming timed_chat(const ServerAddress& server, const std::string& model, const std::string& text,
                        const std::vector<std::string>& image_urls, int64_t max_tokens, bool ignore_eos);

// GET /v1/models: the first served model id ("" when the server does not answer).
std::string first_model(const ServerAddress& server);

// One POST with a JSON body. `status` 0 means no HTTP answer (`error` says why); otherwise `body` is the parsed
// answer (discarded when it was not JSON) and `error`, for a status other than 200, the server's message.
struct JsonReply {
  int status = 0;
  std::string error;
  nlohmann::json body;
  std::vector<nlohmann::json> events;  // post_sse: every `data:` payload but [DONE], in order
};
JsonReply post_json(const ServerAddress& server, const std::string& path, const nlohmann::json& body, int timeout_s);
// The same with stream = true in `body`: the SSE events are collected (an answer other than 200 is read as JSON).
JsonReply post_sse(const ServerAddress& server, const std::string& path, const nlohmann::json& body, int timeout_s);
// GET `path`: its HTTP status, 0 when nothing answered.
int get_status(const ServerAddress& server, const std::string& path, int timeout_s);
// GET `path`'s body when it answers 200, else "".
std::string get_text(const ServerAddress& server, const std::string& path, int timeout_s);
// GET `path` read as JSON.
JsonReply get_json(const ServerAddress& server, const std::string& path, int timeout_s);

}  // namespace kiln::cli
