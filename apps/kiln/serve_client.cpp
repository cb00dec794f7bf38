#include "serve_client.h"

#include <chrono>
#include <sstream>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace kiln::cli {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

httplib::Headers auth(const ServerAddress& s) {
  if (s.api_key.empty()) return {};
  return {{"Authorization", "Bearer " + s.api_key}};
}
}  // namespace

bool parse_base_url(const std::string& url, ServerAddress& out) {
  std::string s = url;
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  if (s.size() >= 3 && s.substr(s.size() - 3) == "/v1") s = s.substr(0, s.size() - 3);
  if (!s.empty() && s.back() == '/') s.pop_back();
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) {
    out.host = s;
    return !s.empty();
  }
  out.host = s.substr(0, colon);
  try {
    out.port = std::stoi(s.substr(colon + 1));
  } catch (...) {
    return false;
  }
  return !out.host.empty() && out.port > 0 && out.port < 65536;
}

std::string first_model(const ServerAddress& server) {
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(5);
  auto res = cli.Get("/v1/models", auth(server));
  if (!res || res->status != 200) return "";
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  // A server's reply is input: any shape but the expected one is "no model", never a throw.
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() || !j["data"][0].is_object())
    return "";
  const nlohmann::json& id = j["data"][0].contains("id") ? j["data"][0]["id"] : nlohmann::json();
  return id.is_string() ? id.get<std::string>() : "";
}

namespace {

// The text a streamed chunk carries: a completion's `text`, or a chat delta's content or reasoning (a model under a
// reasoning parser starts with reasoning: its first token is the first token all the same).
std::string chunk_text(const nlohmann::json& choice) {
  if (choice.contains("text") && choice["text"].is_string()) return choice["text"].get<std::string>();
  if (!choice.contains("delta") || !choice["delta"].is_object()) return "";
  const nlohmann::json& d = choice["delta"];
  for (const char* key : {"content", "reasoning_content"})
    if (d.contains(key) && d[key].is_string() && !d[key].get<std::string>().empty()) return d[key].get<std::string>();
  return "";
}

// POSTs `body` (stream = true, usage included) to `path` and times its chunks from the send.
StreamTiming timed_stream(const ServerAddress& server, const std::string& path, const nlohmann::json& body) {
  StreamTiming t;
  httplib::Client cli(server.host, server.port);
  cli.set_read_timeout(3600);
  cli.set_write_timeout(3600);
  std::string buffer;
  auto start = Clock::now();
  Clock::time_point last;
  bool first = true;
  auto on_data = [&](const char* data, size_t len) {
    buffer.append(data, len);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      auto j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (!j.is_object()) continue;
      if (j.contains("usage") && j["usage"].is_object()) {
        const nlohmann::json& u = j["usage"];
        if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
          t.prompt_tokens = u["prompt_tokens"].get<int64_t>();
        if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
          t.completion_tokens = u["completion_tokens"].get<int64_t>();
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      if (chunk_text(j["choices"][0]).empty()) continue;
      auto now = Clock::now();
      if (first) {
        t.ttft = std::chrono::duration<double>(now - start).count();
        first = false;
      } else {
        t.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
    return true;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = auth(server);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) { return on_data(data, len); };
  auto res = cli.send(req);
  t.latency = since(start);
  if (!res) {
    t.error = "request failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    t.error = "HTTP " + std::to_string(res->status) + ": " + (res->body.empty() ? buffer : res->body);
  } else {
    t.ok = !first;
    if (first) t.error = "the stream carried no text";
  }
  return t;
}

nlohmann::json stream_body(const std::string& model, int64_t max_tokens, bool ignore_eos) {
  nlohmann::json body = {{"model", model},
                         {"max_tokens", max_tokens},
                         {"temperature", 0},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  if (ignore_eos) body["ignore_eos"] = true;
  return body;
}

}  // namespace

StreamTiming timed_completion(const ServerAddress& server, const std::string& model, const std::string& prompt,
                              int64_t max_tokens, bool ignore_eos) {
  nlohmann::json body = stream_body(model, max_tokens, ignore_eos);
  body["prompt"] = prompt;
  return timed_stream(server, "/v1/completions", body);
}

StreamTiming timed_chat(const ServerAddress& server, const std::string& model, const std::string& text,
                        const std::vector<std::string>& image_urls, int64_t max_tokens, bool ignore_eos) {
  nlohmann::json content = nlohmann::json::array();
  for (const std::string& url : image_urls) content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
  content.push_back({{"type", "text"}, {"text", text}});
  nlohmann::json body = stream_body(model, max_tokens, ignore_eos);
  body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", std::move(content)}}});
  return timed_stream(server, "/v1/chat/completions", body);
}

namespace {
// The server's own words for a refusal: OpenAI's {"error": {"message": ...}}, else the raw body.
std::string error_text(const httplib::Result& res, nlohmann::json& body) {
  body = nlohmann::json::parse(res->body, nullptr, false);
  if (!body.is_discarded() && body.contains("error")) {
    const auto& e = body["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return res->body.substr(0, 500);
}
}  // namespace

JsonReply post_json(const ServerAddress& server, const std::string& path, const nlohmann::json& body, int timeout_s) {
  JsonReply r;
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(10);
  cli.set_read_timeout(timeout_s);
  cli.set_write_timeout(timeout_s);
  auto res = cli.Post(path, auth(server), body.dump(), "application/json");
  if (!res) {
    r.error = "request failed: " + httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  if (res->status != 200) {
    r.error = error_text(res, r.body);
    return r;
  }
  r.body = nlohmann::json::parse(res->body, nullptr, false);
  if (r.body.is_discarded()) r.error = "the answer is not JSON: " + res->body.substr(0, 200);
  return r;
}

JsonReply post_sse(const ServerAddress& server, const std::string& path, const nlohmann::json& body, int timeout_s) {
  JsonReply r;
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(10);
  cli.set_read_timeout(timeout_s);
  cli.set_write_timeout(timeout_s);
  std::string buffer;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = auth(server);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      // An event may carry `event:` and comment lines beside its `data:` line (the Responses API names its events).
      std::istringstream lines(event);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
        auto j = nlohmann::json::parse(line.substr(6), nullptr, false);
        if (!j.is_discarded()) r.events.push_back(std::move(j));
      }
    }
    return true;
  };
  auto res = cli.send(req);
  if (!res) {
    r.error = "request failed: " + httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  if (res->status != 200) {
    // A refused request comes back as one JSON error body, which the receiver has collected.
    auto j = nlohmann::json::parse(buffer.empty() ? res->body : buffer, nullptr, false);
    r.body = j;
    r.error = (!j.is_discarded() && j.contains("error") && j["error"].is_object())
                  ? j["error"].value("message", "")
                  : (buffer.empty() ? res->body : buffer).substr(0, 500);
  }
  return r;
}

int get_status(const ServerAddress& server, const std::string& path, int timeout_s) {
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(timeout_s);
  cli.set_read_timeout(timeout_s);
  auto res = cli.Get(path, auth(server));
  return res ? res->status : 0;
}

std::string get_text(const ServerAddress& server, const std::string& path, int timeout_s) {
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(timeout_s);
  cli.set_read_timeout(timeout_s);
  auto res = cli.Get(path, auth(server));
  return res && res->status == 200 ? res->body : "";
}

JsonReply get_json(const ServerAddress& server, const std::string& path, int timeout_s) {
  JsonReply r;
  httplib::Client cli(server.host, server.port);
  cli.set_connection_timeout(timeout_s);
  cli.set_read_timeout(timeout_s);
  auto res = cli.Get(path, auth(server));
  if (!res) {
    r.error = "request failed: " + httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200) r.error = res->body.substr(0, 500);
  return r;
}

}  // namespace kiln::cli
