#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kiln/log.h"
#include "server/chat_completions_route.h"
#include "server/choice_set.h"
#include "server/completions_route.h"
#include "server/generation_session.h"
#include "server/guarded_http_server.h"
#include "server/responses_route.h"
#include "server/server_metrics.h"
#include "server/structured_output.h"
#include "tokenizer/chat_template.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using Preparer = std::function<std::optional<ApiError>(const ServerContext&, const ojson&, PreparedGeneration&)>;

// How often a request's HTTP thread looks for engine events, a departed client and a shutdown deadline.
constexpr auto kPoll = std::chrono::milliseconds(50);
// After the drain timeout cancels what is left: bound on waiting for those requests' last writes.
constexpr auto kCancelFlushTimeout = std::chrono::seconds(5);

// Compares without an early exit, so response time does not reveal how much of a guessed key was right.
bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Counts a generation request as in flight for as long as it lives.
class InFlightSlot {
 public:
  explicit InFlightSlot(std::atomic<int64_t>& counter) : counter_(counter) {}
  ~InFlightSlot() { --counter_; }

 private:
  std::atomic<int64_t>& counter_;
};

struct StreamState {
  std::shared_ptr<GenerationSession> session;
  std::unique_ptr<ResponseWriter> writer;
  std::shared_ptr<InFlightSlot> slot;
  bool begun = false;
  bool report_progress = false;  // stream_options.include_prefill_progress
  bool begun_tokens = false;     // output has started: no more progress events
  Clock::time_point last_write = Clock::now();
};

GenerationResult result_of(const GenerationSession& session, const SessionUpdate& last) {
  return {last.finish_reason, session.usage(), session.tool_calls()};
}

ApiError server_fault(const std::string& message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = message;
  return e;
}

ApiError cancelled_by_shutdown() {
  return api_error_from_status(
      unavailable("the server is shutting down and cancelled this request (server.drain_timeout_s passed)"));
}

// A 500 is a fault of this server, not of the request: it is logged under an id the client is also given.
ApiError logged(ApiError error) {
  if (error.http_status < 500 || error.http_status == 503) return error;
  const std::string id = random_id("req_", 16);
  log::error("request {} failed with HTTP {}: {}", id, error.http_status, error.message);
  error.message += " (request id " + id + ")";
  return error;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct HttpServer::Impl {
  Impl(Engine& e, const Tokenizer& t, HttpServerOptions o) : engine(e), tokenizer(t), options(std::move(o)) {}

  Engine& engine;
  Tokenizer tokenizer;
  HttpServerOptions options;
  ServerContext ctx;
  std::unique_ptr<MediaInput> media;
  std::unique_ptr<StructuredOutput> structured_output;  // null: the engine applies no token masks
  ServerMetrics metrics;
  std::unique_ptr<GuardedHttpServer> http;
  std::thread listener;
  int bound_port = 0;
  int64_t created = unix_now();
  std::atomic<bool> draining{false};
  std::atomic<bool> cancel_in_flight{false};  // the drain timeout passed: requests still running end now
  std::atomic<int64_t> in_flight{0};
  std::mutex lifecycle_mutex;
  bool started = false, stopped = false;

  void send_error(httplib::Response& res, const ApiError& error) {
    metrics.count_rejected(error.http_status);
    res.status = error.http_status;
    res.set_content(logged(error).dump(), "application/json");
  }

  std::shared_ptr<InFlightSlot> acquire_slot() {
    int64_t current = in_flight.load();
    do {
      if (current >= options.max_concurrent_requests) return nullptr;
    } while (!in_flight.compare_exchange_weak(current, current + 1));
    return std::make_shared<InFlightSlot>(in_flight);
  }

  void serve_generation(const httplib::Request& req, httplib::Response& res, const Preparer& prepare) {
    const auto arrival = Clock::now();
    if (draining) {
      ApiError e = api_error_from_status(unavailable("the server is shutting down"));
      return send_error(res, e);
    }
    ojson body;
    ApiError error;
    if (!parse_json_body(req.body, &body, &error)) return send_error(res, error);
    PreparedGeneration prepared;
    if (auto e = prepare(ctx, body, prepared)) return send_error(res, *e);
    auto slot = acquire_slot();
    if (!slot) {
      return send_error(res, api_error_from_status(resource_exhausted("the server is at capacity (" +
                                                                      std::to_string(options.max_concurrent_requests) +
                                                                      " requests in flight); retry later")));
    }
    if (prepared.request.n > 1) return serve_choices(res, prepared, arrival, slot);
    auto session = std::make_shared<GenerationSession>(engine, metrics, tokenizer, prepared.request.output, arrival);
    const bool report_progress = prepared.request.params.report_prefill_progress;
    Status submitted = session->start(std::move(prepared.request.params), prepared.request.prefill);
    if (!submitted.ok()) return send_error(res, api_error_from_status(submitted));

    if (!prepared.request.stream) {
      OutputPieces all;
      SessionUpdate update;
      do {
        update = session->next(kPoll);
        append_pieces(all, std::move(update.pieces));
        prepared.writer->add_logprobs(std::move(update.logprobs));
        if (update.finished) break;
        if (!GuardedHttpServer::client_connected()) {
          session->abandon();  // nobody is waiting for the answer (an SDK timeout): free the sequence now
          return;
        }
        if (cancel_in_flight) {
          session->abandon();
          return send_error(res, cancelled_by_shutdown());
        }
      } while (true);
      if (update.finish_reason == "error")
        return send_error(res, generation_failed(Status(update.error_code, update.error)));
      res.set_content(prepared.writer->complete(all, result_of(*session, update))
                          .dump(-1, ' ', false, ojson::error_handler_t::replace),
                      "application/json");
      return;
    }

    auto state = std::make_shared<StreamState>();
    state->session = session;
    state->writer = std::move(prepared.writer);
    state->slot = slot;
    state->report_progress = report_progress;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state](size_t, httplib::DataSink& sink) {
          std::string out;
          if (!state->begun) {
            out = state->writer->stream_begin();
            state->begun = true;
          }
          SessionUpdate update = state->session->next(kPoll);
          state->writer->add_logprobs(std::move(update.logprobs));
          out += state->writer->stream_pieces(update.pieces);
          if (update.finished) {
            out += update.finish_reason == "error"
                       ? state->writer->stream_error(logged(generation_failed(Status(update.error_code, update.error))))
                       : state->writer->stream_end(result_of(*state->session, update));
          } else if (cancel_in_flight) {
            state->session->abandon();
            out += state->writer->stream_error(cancelled_by_shutdown());
            update.finished = true;
          }
          if (state->report_progress && update.prefill_total > 0 && !state->begun_tokens && !update.finished) {
            out += "event: prefill_progress\ndata: " +
                   ojson{{"object", "prefill.progress"},
                         {"choices", ojson::array()},  // SDKs that read it as a chunk see one without choices
                         {"prompt_tokens_done", update.prefilled_tokens},
                         {"prompt_tokens_total", update.prefill_total}}
                       .dump() +
                   "\n\n";
          }
          if (!update.pieces.empty()) state->begun_tokens = true;
          const auto now = Clock::now();
          if (out.empty() && now - state->last_write >= options.keep_alive_interval) out = ": keep-alive\n\n";
          if (!out.empty()) {
            if (!sink.write(out.data(), out.size())) {
              state->session->abandon();  // the client is gone: free the sequence now
              return false;
            }
            state->last_write = now;
          }
          if (update.finished) sink.done();
          return true;
        },
        [state](bool) { state->session->abandon(); });
  }

  // n > 1: the choices run as sequences of their own (server/choice_set.h), in one body or one stream.
  void serve_choices(httplib::Response& res, PreparedGeneration& prepared, Clock::time_point arrival,
                     std::shared_ptr<InFlightSlot> slot) {
    auto started = ChoiceSet::start(engine, metrics, tokenizer, prepared, arrival);
    if (!started.ok()) return send_error(res, api_error_from_status(started.status()));
    std::shared_ptr<ChoiceSet> set = std::move(started).value();
    if (!prepared.request.stream) {
      while (!set->poll(kPoll)) {
        if (!GuardedHttpServer::client_connected()) return set->abandon();
        if (cancel_in_flight) {
          set->abandon();
          return send_error(res, cancelled_by_shutdown());
        }
      }
      if (set->error()) return send_error(res, generation_failed(*set->error()));
      res.set_content(set->body().dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
      return;
    }
    std::shared_ptr<ResponseWriter> error_writer = std::move(prepared.writer);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto last_write = std::make_shared<Clock::time_point>(Clock::now());
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, set, slot, error_writer, last_write](size_t, httplib::DataSink& sink) {
          std::string out = set->stream_next(kPoll);
          bool done = set->finished();
          if (done && set->error()) {
            out += error_writer->stream_error(logged(generation_failed(*set->error())));
          } else if (!done && cancel_in_flight) {
            set->abandon();
            out += error_writer->stream_error(cancelled_by_shutdown());
            done = true;
          }
          const auto now = Clock::now();
          if (out.empty() && now - *last_write >= options.keep_alive_interval) out = ": keep-alive\n\n";
          if (!out.empty()) {
            if (!sink.write(out.data(), out.size())) {
              set->abandon();
              return false;
            }
            *last_write = now;
          }
          if (done) sink.done();
          return true;
        },
        [set](bool) { set->abandon(); });
  }

  void install_routes() {
    http->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (constant_time_equal(req.get_header_value("Authorization"), "Bearer " + options.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      ApiError e;
      e.http_status = 401;
      e.message = "Incorrect or missing API key: send \"Authorization: Bearer <key>\".";
      e.code = "invalid_api_key";
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    });
    // Statuses httplib sets itself (unknown route, oversized body, malformed request head) get OpenAI-shaped bodies.
    http->set_error_handler(
        httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          ApiError e;
          e.http_status = res.status;
          e.message = "request failed with HTTP status " + std::to_string(res.status);
          if (res.status == 404) {
            e.message = "no route for " + req.method + " " + req.path;
            e.code = "not_found";
          } else if (res.status == 413) {
            e.message = "the request body is larger than this server accepts (" + std::to_string(max_body_bytes()) +
                        " bytes, server.max_body_bytes)";
            e.param = "body";
            e.code = "request_too_large";
          }
          if (res.status >= 400) metrics.count_rejected(res.status);
          res.set_content(logged(e).dump(), "application/json");
          return httplib::Server::HandlerResponse::Handled;
        }));
    http->set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      send_error(res, server_fault("internal error in " + req.method + " " + req.path + ": " + what));
    });

    http->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      serve_generation(req, res, prepare_chat_completion);
    });
    http->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      serve_generation(req, res, prepare_completion);
    });
    http->Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
      serve_generation(req, res, prepare_response);
    });
    http->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      ojson model = {{"id", ctx.served_name},
                     {"object", "model"},
                     {"created", created},
                     {"owned_by", "kiln"},
                     {"root", ctx.model_id},
                     {"parent", nullptr},
                     {"max_model_len", ctx.max_model_len}};
      res.set_content(ojson({{"object", "list"}, {"data", ojson::array({model})}}).dump(), "application/json");
    });
    http->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = draining ? 503 : 200;
      res.set_content(ojson({{"status", draining ? "draining" : "ok"}}).dump(), "application/json");
    });
    http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(engine.metrics(), ctx.served_name, in_flight.load()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
  }

  int64_t max_body_bytes() const {
    return options.max_body_bytes > 0 ? options.max_body_bytes : default_max_body_bytes(options.max_model_len);
  }

  // Waits until no generation request is in flight, or `deadline`; true when none is.
  bool wait_in_flight(Clock::time_point deadline) const {
    while (in_flight.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return in_flight.load() == 0;
  }
};

int64_t default_max_body_bytes(int64_t max_model_len) {
  return (int64_t{1} << 20) + 16 * std::max<int64_t>(max_model_len, 0);
}

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::port() const {
  return impl_->bound_port;
}

Status HttpServer::start() {
  Impl& s = *impl_;
  std::lock_guard lock(s.lifecycle_mutex);
  if (s.started) return failed_precondition("HttpServer::start: already started");
  HttpServerOptions& o = s.options;
  // The recipe spells "no parser" as "none".
  if (o.tool_parser == "none") o.tool_parser.clear();
  if (o.reasoning_parser == "none") o.reasoning_parser.clear();
  if (o.max_model_len <= 0) return invalid_argument("server: max_model_len must be positive");
  if (o.tool_parser != "" && !is_tool_parser(o.tool_parser)) {
    return invalid_argument("server.tool_parser: unknown parser \"" + o.tool_parser + "\" (known: " + kToolParserNames +
                            ")");
  }
  if (o.reasoning_parser != "" && o.reasoning_parser != "glm45") {
    return invalid_argument("server.reasoning_parser: unknown parser \"" + o.reasoning_parser +
                            "\" (known: glm45, none)");
  }
  if (o.max_concurrent_requests <= 0) return invalid_argument("server: max_concurrent_requests must be positive");
  if (o.max_connections <= 0 || o.max_connections > kMaxConnections) {
    return invalid_argument("server.max_connections must be between 1 and " + std::to_string(kMaxConnections) +
                            ", got " + std::to_string(o.max_connections));
  }
  if (o.max_body_bytes < 0) return invalid_argument("server.max_body_bytes must not be negative");
  if (o.keep_alive_interval.count() <= 0) return invalid_argument("server.keep_alive_interval_s must be positive");

  s.ctx.tokenizer = &s.tokenizer;
  s.ctx.model_id = o.model_id;
  s.ctx.served_name = !o.served_name.empty() ? o.served_name : (!o.model_id.empty() ? o.model_id : "kiln");
  s.ctx.max_model_len = o.max_model_len;
  s.ctx.max_output_tokens = o.max_output_tokens;
  s.ctx.logprobs_supported = s.engine.reports_logprobs();
  s.ctx.logit_adjustments_supported = s.engine.applies_logit_adjustments();
  s.ctx.vocab_size = s.engine.vocab_size() > 0 ? s.engine.vocab_size() : s.tokenizer.vocab_size();
  s.ctx.tool_parser = o.tool_parser;
  s.ctx.reasoning_parser = o.reasoning_parser;
  if (o.media.modality) {
    if (o.media.max_images < 0) return invalid_argument("media.max_images must not be negative");
    s.media = std::make_unique<MediaInput>(o.media);
    s.ctx.media = s.media.get();
  }
  // GLM-4.7's own template renders with the built-in renderer, proven identical and faster.
  const auto& t = o.chat_template;
  if (t && !(t->source(false) == glm47_chat_template_source() && t->source(true) == glm47_chat_template_source())) {
    s.ctx.chat_template = t.get();
    s.ctx.special_token_texts = s.tokenizer.special_token_texts();
  }
  // GLM's end-of-turn tokens, and DeepSeek-V3's end of sentence (which a finished DeepSeek tool-call grammar needs).
  for (const char* token : {"<|endoftext|>", "<|user|>", "<|observation|>", "<｜end▁of▁sentence｜>"}) {
    if (auto id = s.tokenizer.token_to_id(token)) s.ctx.end_of_turn_ids.push_back(*id);
  }
  if (s.engine.applies_constraints()) {
    s.structured_output = std::make_unique<StructuredOutput>(s.tokenizer, s.engine.vocab_size(), s.ctx.end_of_turn_ids);
    s.ctx.structured_output = s.structured_output.get();
  }

  // A client that disconnects makes send() raise SIGPIPE, which would kill the process; the failed write is
  // handled as a disconnect instead.
  std::signal(SIGPIPE, SIG_IGN);
  ConnectionLimits limits;
  limits.max_connections = o.max_connections;
  limits.header_timeout = o.header_timeout;
  limits.read_timeout = o.read_timeout;
  limits.tcp_keepalive_idle =
      std::chrono::ceil<std::chrono::seconds>(std::chrono::duration_cast<std::chrono::milliseconds>(o.keep_alive_interval));
  ApiError busy = api_error_from_status(unavailable("the server has " + std::to_string(o.max_connections) +
                                                    " connections open (server.max_connections); retry later"));
  busy.code = "too_many_connections";
  s.http = std::make_unique<GuardedHttpServer>(limits, busy.dump(), [&s] { s.metrics.count_rejected(503); });
  s.http->set_payload_max_length(static_cast<size_t>(s.max_body_bytes()));
  s.install_routes();
  if (o.port == 0) {
    s.bound_port = s.http->bind_to_any_port(o.host);
    if (s.bound_port < 0) return unavailable("server: cannot bind a free port on " + o.host);
  } else {
    if (!s.http->bind_to_port(o.host, o.port)) {
      return unavailable("server: cannot bind " + o.host + ":" + std::to_string(o.port) +
                         " (in use, or not an address of this machine)");
    }
    s.bound_port = o.port;
  }
  s.listener = std::thread([&s] { s.http->listen_after_bind(); });
  // httplib's stop() only closes a listener that is already running; wait for it so stop() can never miss it.
  while (!s.http->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.started = true;
  return ok_status();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  std::lock_guard lock(s.lifecycle_mutex);
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.draining = true;
  // engine.drain() returns once every request has finished or been cancelled; the requests' HTTP threads write
  // their last chunks meanwhile, so the listener closes only after them.
  std::thread drainer([&s] { s.engine.drain(); });
  if (!s.wait_in_flight(Clock::now() + s.options.drain_timeout)) {
    log::warn("drain timeout ({} ms) passed with {} requests in flight: cancelling them",
              s.options.drain_timeout.count(), s.in_flight.load());
    s.cancel_in_flight = true;
    s.wait_in_flight(Clock::now() + kCancelFlushTimeout);
  }
  drainer.join();
  s.http->stop();
  if (s.listener.joinable()) s.listener.join();
}

}  // namespace kiln
