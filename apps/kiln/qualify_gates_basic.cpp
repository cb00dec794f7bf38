// The smoke, strict-JSON, Responses API and image gates of `kiln qualify`.
#include <algorithm>
#include <cctype>

#include "json_schema_check.h"
#include "qualify_gates.h"
#include "utf8_prefix.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

json pass_case(const std::string& name, json extra = json::object()) {
  extra["case"] = name;
  extra["pass"] = true;
  return extra;
}
json fail_case(const std::string& name, const std::string& why) {
  return {{"case", name}, {"pass", false}, {"why", why}};
}

void add(GateResult& g, json c) {
  ++g.total;
  if (c.value("pass", false)) ++g.passed;
  g.details.push_back(std::move(c));
}

// The assistant's text in a chat answer ("" when it has none).
std::string chat_text(const json& body) {
  const json& m = body["choices"][0]["message"];
  return m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
}

bool chat_shape_ok(const json& body) {
  return body.is_object() && body.contains("choices") && body["choices"].is_array() && !body["choices"].empty() &&
         body["choices"][0].contains("message");
}

// Schemas of the kinds clients send: nested objects, arrays, enums, bounds; each closed (additionalProperties false),
// as OpenAI's strict mode requires.
struct JsonTask {
  const char* name;
  const char* prompt;
  const char* schema;
};
const JsonTask kJsonTasks[] = {
    {"person", "Invent a fictional person. Reply with JSON giving their name, their age in years and their home city.",
     R"({"type":"object","properties":{"name":{"type":"string","minLength":1},"age":{"type":"integer","minimum":0,"maximum":150},
        "city":{"type":"string","minLength":1}},"required":["name","age","city"],"additionalProperties":false})"},
    {"order",
     "Write a small shop order as JSON: a list of items, each a SKU and a quantity, the total price and the currency "
     "(USD or EUR).",
     R"({"type":"object","properties":{"items":{"type":"array","minItems":1,"items":{"type":"object","properties":{
        "sku":{"type":"string","minLength":1},"quantity":{"type":"integer","minimum":1}},"required":["sku","quantity"],
        "additionalProperties":false}},"total":{"type":"number","minimum":0},"currency":{"type":"string","enum":["USD","EUR"]}},
        "required":["items","total","currency"],"additionalProperties":false})"},
    {"verdict",
     "Is water wet? Answer as JSON: yes or no, your confidence between 0 and 1, and at most three short reasons.",
     R"({"type":"object","properties":{"answer":{"type":"string","enum":["yes","no"]},"confidence":{"type":"number","minimum":0,
        "maximum":1},"reasons":{"type":"array","maxItems":3,"items":{"type":"string"}}},"required":["answer","confidence","reasons"],
        "additionalProperties":false})"},
};

// A 64×64 PNG filled with one red (220, 20, 20): small enough to embed, unambiguous enough for any vision model.
constexpr const char* kRedPng =
    "iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAAlC+aJAAAAT0lEQVR42u3PQQkAAAgEsAtx/"
    "ZMZxgi+hcEKLNO+FgEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB"
    "AQEBAQEBAQEBAQEBAQEBAQEBAQGBywKqxUDxqh7TUQAAAABJRU5ErkJggg==";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

GateResult gate_smoke(GateClient& c) {
  GateResult g;
  g.name = "smoke";
  JsonReply r = c.call(g.name, "/v1/chat/completions", c.chat({{{"role", "user"}, {"content", "Say hello."}}}, 32));
  if (r.status != 200) {
    add(g, fail_case("chat completion", reply_failure(r)));
  } else if (!chat_shape_ok(r.body)) {
    add(g, fail_case("chat completion", "no choices[0].message in the answer"));
  } else {
    const json& choice = r.body["choices"][0];
    const std::string finish = choice.contains("finish_reason") && choice["finish_reason"].is_string()
                                   ? choice["finish_reason"].get<std::string>()
                                   : "";
    const json usage = r.body.value("usage", json::object());
    const int64_t prompt = usage.value("prompt_tokens", 0), completion = usage.value("completion_tokens", 0);
    if (chat_text(r.body).empty())
      add(g, fail_case("chat completion", "no text in message.content"));
    else if (finish != "stop" && finish != "length")
      add(g, fail_case("chat completion", "finish_reason `" + finish + "`"));
    else if (prompt <= 0 || completion <= 0 || usage.value("total_tokens", 0) != prompt + completion)
      add(g, fail_case("chat completion", "usage " + usage.dump()));
    else
      add(g, pass_case("chat completion", {{"finish_reason", finish}, {"usage", usage}}));
  }
  g.finish();
  return g;
}

GateResult gate_strict_json(GateClient& c) {
  GateResult g;
  g.name = "strict JSON";
  for (int64_t i = 0; i < c.settings().json_requests; ++i) {
    const JsonTask& task = kJsonTasks[i % std::size(kJsonTasks)];
    const json schema = json::parse(task.schema);
    const std::string name = std::string(task.name) + " #" + std::to_string(i + 1);
    json body = c.chat({{{"role", "user"}, {"content", task.prompt}}}, 256);
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", task.name}, {"strict", true}, {"schema", schema}}}};
    JsonReply r = c.call(g.name, "/v1/chat/completions", body);
    if (r.status >= 400 && r.status < 500 && i == 0) {
      // Refused outright: the server has no structured output. Nineteen more refusals would add nothing.
      g.total = c.settings().json_requests;
      g.reason = "not supported by this server (" + reply_failure(r) + ")";
      g.details.push_back(fail_case(name, reply_failure(r)));
      break;
    }
    if (r.status != 200) {
      add(g, fail_case(name, reply_failure(r)));
      continue;
    }
    if (!chat_shape_ok(r.body)) {
      add(g, fail_case(name, "no choices[0].message in the answer"));
      continue;
    }
    const std::string text = chat_text(r.body);
    const json value = json::parse(text, nullptr, false);
    const json& reason = r.body["choices"][0]["finish_reason"];
    const std::string finish = reason.is_string() ? reason.get<std::string>() : reason.dump();
    if (value.is_discarded()) {
      add(g, fail_case(name, "not JSON (finish_reason " + finish + "): " + utf8_prefix(text, 120)));
      continue;
    }
    const std::string violation = json_schema_violation(schema, value);
    if (!violation.empty())
      add(g, fail_case(name, "violates the schema: " + violation));
    else
      add(g, pass_case(name));
  }
  g.finish();
  return g;
}

GateResult gate_responses(GateClient& c) {
  GateResult g;
  g.name = "Responses API";
  json base = {{"max_output_tokens", 128}, {"temperature", 0}};
  // The Responses API's switch for thinking, as chat_template_kwargs is the chat API's.
  if (!c.settings().thinking) base["reasoning"] = {{"effort", "none"}};

  json plain = base;
  plain["input"] = "Say hi.";
  plain["instructions"] = "Be brief.";
  JsonReply r = c.call(g.name, "/v1/responses", plain);
  if (r.status != 200) {
    add(g, fail_case("plain", reply_failure(r)));
  } else {
    std::string text;
    for (const auto& item : r.body.value("output", json::array()))
      if (item.value("type", "") == "message")
        for (const auto& part : item.value("content", json::array())) text += part.value("text", "");
    const std::string status = r.body.value("status", "");
    if (status != "completed")
      add(g, fail_case("plain", "status `" + status + "`"));
    else if (text.empty())
      add(g, fail_case("plain", "no output_text"));
    else if (r.body.value("usage", json::object()).value("output_tokens", 0) <= 0)
      add(g, fail_case("plain", "no usage.output_tokens"));
    else
      add(g, pass_case("plain"));
  }

  json streamed = plain;
  streamed["stream"] = true;
  r = c.call(g.name, "/v1/responses", streamed);
  if (r.status != 200 || r.events.empty()) {
    add(g, fail_case("streamed", r.status != 200 ? reply_failure(r) : "no events"));
  } else {
    bool delta = false;
    for (const auto& e : r.events) delta = delta || e.value("type", "") == "response.output_text.delta";
    const std::string first = r.events.front().value("type", ""), last = r.events.back().value("type", "");
    if (first != "response.created" || last != "response.completed")
      add(g, fail_case("streamed", "events run from `" + first + "` to `" + last + "`"));
    else if (!delta)
      add(g, fail_case("streamed", "no response.output_text.delta"));
    else
      add(g, pass_case("streamed", {{"events", r.events.size()}}));
  }

  // A function call, then its output sent back: the client loop agents run on the Responses API.
  const json params = json::parse(R"({"type":"object","properties":{"city":{"type":"string","minLength":1}},
                                      "required":["city"],"additionalProperties":false})");
  json call = base;
  call["max_output_tokens"] = 256;
  call["input"] = "What is the weather in Paris right now? Use the get_weather tool.";
  call["tools"] = json::array({{{"type", "function"},
                                {"name", "get_weather"},
                                {"description", "Current weather for a city"},
                                {"parameters", params}}});
  r = c.call(g.name, "/v1/responses", call);
  json fc;
  if (r.status == 200)
    for (const auto& item : r.body.value("output", json::array()))
      if (item.value("type", "") == "function_call" && fc.is_null()) fc = item;
  if (r.status != 200) {
    add(g, fail_case("function call round trip", reply_failure(r)));
  } else if (fc.is_null() || fc.value("name", "") != "get_weather") {
    add(g, fail_case("function call round trip", "no get_weather function_call in the output"));
  } else {
    const json args = json::parse(fc.value("arguments", ""), nullptr, false);
    const std::string violation = args.is_discarded() ? "arguments are not JSON: " + fc.value("arguments", "")
                                                      : json_schema_violation(params, args);
    if (!violation.empty()) {
      add(g, fail_case("function call round trip", violation));
    } else {
      json next = call;
      next["input"] = json::array(
          {{{"role", "user"}, {"content", call["input"]}},
           fc,
           {{"type", "function_call_output"}, {"call_id", fc.value("call_id", "")}, {"output", "Sunny, 24 C"}}});
      r = c.call(g.name, "/v1/responses", next);
      std::string text;
      if (r.status == 200)
        for (const auto& item : r.body.value("output", json::array()))
          if (item.value("type", "") == "message")
            for (const auto& part : item.value("content", json::array())) text += part.value("text", "");
      if (r.status != 200)
        add(g, fail_case("function call round trip", "after the output: " + reply_failure(r)));
      else if (text.find("24") == std::string::npos)
        add(g, fail_case("function call round trip",
                         "the answer after the output does not use it (no `24`): " + utf8_prefix(text, 120)));
      else
        add(g, pass_case("function call round trip"));
    }
  }
  g.finish();
  return g;
}

GateResult gate_images(GateClient& c) {
  GateResult g;
  g.name = "images";
  if (!c.settings().images) {
    g.outcome = GateResult::Outcome::kSkipped;
    g.reason = c.settings().image_skip_reason;
    return g;
  }
  const json content =
      json::array({{{"type", "image_url"}, {"image_url", {{"url", std::string("data:image/png;base64,") + kRedPng}}}},
                   {{"type", "text"}, {"text", "What is the color of this image? Answer with one word."}}});
  JsonReply r = c.call(g.name, "/v1/chat/completions", c.chat({{{"role", "user"}, {"content", content}}}, 16));
  if (r.status != 200)
    add(g, fail_case("solid red square", reply_failure(r)));
  else if (!chat_shape_ok(r.body))
    add(g, fail_case("solid red square", "no choices[0].message in the answer"));
  else if (lower(chat_text(r.body)).find("red") == std::string::npos)
    add(g, fail_case("solid red square", "answer `" + utf8_prefix(chat_text(r.body), 80) + "` does not say red"));
  else
    add(g, pass_case("solid red square",
                     {{"prompt_tokens", r.body.value("usage", json::object()).value("prompt_tokens", 0)}}));
  g.finish();
  return g;
}

}  // namespace kiln::cli
