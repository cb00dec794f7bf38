// The OpenAI-compatible HTTP server (cpp-httplib, a thread per connection from a bounded pool) in front of one
// kiln::Engine. Routes:
//   POST /v1/chat/completions  POST /v1/completions  POST /v1/responses   (SSE when "stream": true)
//   GET /v1/models  GET /health  GET /metrics (Prometheus text)
// With an API key, /v1/* needs "Authorization: Bearer <key>" (401 otherwise); /health and /metrics stay open for
// probes and scrapers. Connection limits and timeouts against slow or abusive clients: guarded_http_server.h.
// Engine events arrive on the engine thread and are handed to the request's HTTP thread through a small queue;
// a client that disconnects makes the next write fail, and the request is cancelled in the engine at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine_api.h"
#include "kiln/status.h"
#include "server/media_input.h"
#include "tokenizer/jinja_chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0 = any free port (see HttpServer::port())
  std::string model_id;                    // the checkpoint (path or hub id); accepted as "model" too
  std::string served_name;                 // the name clients send as "model" and see in responses (default: model_id)
  int64_t max_model_len = 0;               // prompt + completion limit, as the engine enforces it
  int64_t max_output_tokens = 0;           // cap on a request's completion tokens; 0 = whatever the context leaves
  std::string api_key;                     // empty = no authentication
  std::string tool_parser = "glm47";       // "glm47", or "none"/"" (calls stay in the text)
  std::string reasoning_parser = "glm45";  // "glm45", or "none"/"" (reasoning stays in the text)
  int max_concurrent_requests = 256;       // generation requests served at once; beyond: 429
  int max_connections = 512;               // connections served at once; beyond: 503 with Retry-After
  int64_t max_body_bytes = 0;              // larger bodies get 413; 0 = default_max_body_bytes(max_model_len)
  std::chrono::milliseconds header_timeout{10'000};  // request line + headers, from their first byte
  std::chrono::milliseconds read_timeout{60'000};    // request body, from the end of the headers
  // stop() waits this long for requests in flight, then cancels them (streams end with an error event).
  std::chrono::milliseconds drain_timeout{30'000};
  // A stream with nothing to send for this long (a long prefill) gets an SSE comment ": keep-alive", so clients and
  // proxies with idle timeouts stay connected; every connection also gets TCP keep-alive probes at this interval
  // (rounded up to whole seconds), which is what keeps a non-streaming request's silent connection alive.
  std::chrono::milliseconds keep_alive_interval{5'000};
  // Image parts of chat and Responses requests go through this (the recipe's media.modality); without a modality
  // they are refused.
  MediaInputOptions media;
  // The checkpoint's chat template (JinjaChatTemplate::from_checkpoint). Null, or GLM-4.7's own template, renders
  // with the built-in GLM-4.7 renderer (tokenizer/chat_template.h), as do requests with image parts for now.
  std::shared_ptr<const JinjaChatTemplate> chat_template;
};

// What max_body_bytes = 0 means: room for a prompt of max_model_len tokens at 16 bytes each (English runs about
// 4 bytes per token, CJK written as JSON \u escapes about 9) plus 1 MiB for tools and the rest of the body.
// Bounding the body bounds the work (parsing, tokenising) spent on a request before its length is judged.
int64_t default_max_body_bytes(int64_t max_model_len);

class HttpServer {
 public:
  // `engine` must outlive the server; the tokenizer is shared (cheap copy).
  HttpServer(Engine& engine, const Tokenizer& tokenizer, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Validates the options, binds host:port and serves on a background thread. Fails (kInvalidArgument,
  // kUnavailable) naming the option or the address.
  Status start();
  // The bound port (after start()).
  int port() const;
  // Graceful shutdown: new generation requests get 503 (and /health turns 503), engine.drain() finishes the
  // requests in flight while their responses are still written, then the listener closes. Requests still running
  // after drain_timeout are cancelled and answered 503. Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
