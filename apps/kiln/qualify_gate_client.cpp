// GateClient (qualify_gates.h): the requests every gate sends, each logged to the transcript.
#include <chrono>

#include "json_text.h"
#include "qualify_gates.h"
#include "serve_sweeps.h"

namespace kiln::cli {

std::string reply_failure(const JsonReply& r) {
  if (r.status == 0) return r.error;
  return std::to_string(r.status) + ": " + r.error;
}

JsonReply GateClient::call(const std::string& gate, const std::string& path, nlohmann::json body) {
  body["model"] = model_;
  const bool stream = body.value("stream", false);
  const auto t0 = std::chrono::steady_clock::now();
  JsonReply r =
      stream ? post_sse(server_, path, body, settings_.timeout_s) : post_json(server_, path, body, settings_.timeout_s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Long padding is cut from the transcript: it is the request's size, not its content, that matters there.
  nlohmann::json logged = body;
  if (logged.contains("messages"))
    for (auto& m : logged["messages"])
      if (m.contains("content") && m["content"].is_string() &&
          m["content"].get_ref<const std::string&>().size() > 2000) {
        const std::string& s = m["content"].get_ref<const std::string&>();
        m["content"] =
            s.substr(0, 300) + " …[" + std::to_string(s.size() - 600) + " bytes cut]… " + s.substr(s.size() - 300);
      }
  nlohmann::json line = {
      {"gate", gate}, {"path", path}, {"request", logged}, {"status", r.status}, {"seconds", seconds}};
  if (!r.error.empty()) line["error"] = r.error;
  if (stream)
    line["events"] = r.events;
  else if (!r.body.is_discarded())
    line["response"] = r.body;
  transcript_ << json_text(line) << "\n";
  transcript_.flush();
  return r;
}

nlohmann::json GateClient::chat(const nlohmann::json& messages, int64_t max_tokens) const {
  return {{"messages", messages},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"chat_template_kwargs", {{"enable_thinking", settings_.thinking}}}};
}

std::string GateClient::filler(int64_t tokens, std::mt19937_64& rng) {
  if (tokens_per_word_ <= 0) {
    std::string error;
    tokens_per_word_ = probe_tokens_per_word(server_, model_, rng, error);
    if (tokens_per_word_ <= 0) tokens_per_word_ = 1.5;  // the probe's failure shows in the gate that needed it
  }
  return make_prompt(std::max<int64_t>(1, static_cast<int64_t>(tokens / tokens_per_word_)), rng);
}

}  // namespace kiln::cli
