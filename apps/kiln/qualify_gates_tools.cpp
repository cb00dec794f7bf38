// The tool-call gate of `kiln qualify`: the five shapes agent clients depend on — one call, parallel calls, a streamed
// call, the answer after a tool result, and a call at the end of a long prompt — each with tool_choice "auto", as
// clients send it, and arguments checked against the tool's schema.
#include <algorithm>
#include <cctype>
#include <map>

#include "json_schema_check.h"
#include "qualify_gates.h"
#include "utf8_prefix.h"

namespace kiln::cli {
namespace {

using nlohmann::json;

const json& weather_params() {
  static const json p = json::parse(R"({"type":"object","properties":{"city":{"type":"string","minLength":1},
      "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"],"additionalProperties":false})");
  return p;
}

json tools() {
  return json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"}, {"description", "Current weather for a city"}, {"parameters", weather_params()}}}},
       {{"type", "function"},
        {"function",
         {{"name", "get_time"},
          {"description", "Current local time in an IANA time zone"},
          {"parameters", json::parse(R"({"type":"object","properties":{"timezone":{"type":"string"}},
                                                     "required":["timezone"],"additionalProperties":false})")}}}}});
}

const char* kCities[] = {"Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Mumbai"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

struct Call {
  std::string name, arguments;
};

// "" when `calls` are get_weather calls, valid for its schema, naming each of `cities`; else what is wrong.
std::string check_weather_calls(const std::vector<Call>& calls, const std::vector<std::string>& cities) {
  if (calls.size() < cities.size())
    return std::to_string(calls.size()) + " tool call(s), expected " + std::to_string(cities.size());
  std::string named;
  for (const Call& c : calls) {
    if (c.name != "get_weather") return "called `" + c.name + "`, expected get_weather";
    const json args = json::parse(c.arguments, nullptr, false);
    if (args.is_discarded()) return "arguments are not JSON: " + utf8_prefix(c.arguments, 120);
    if (std::string v = json_schema_violation(weather_params(), args); !v.empty())
      return "arguments violate the schema: " + v;
    named += lower(args["city"].get<std::string>()) + "|";
  }
  for (const auto& city : cities)
    if (named.find(lower(city)) == std::string::npos) return "no call for " + city + " (arguments name " + named + ")";
  return "";
}

std::vector<Call> message_calls(const json& message) {
  std::vector<Call> out;
  for (const auto& tc : message.value("tool_calls", json::array())) {
    const json f = tc.value("function", json::object());
    out.push_back({f.value("name", ""),
                   f.contains("arguments") && f["arguments"].is_string() ? f["arguments"].get<std::string>() : ""});
  }
  return out;
}

std::string finish_of(const json& choice) {
  return choice.contains("finish_reason") && choice["finish_reason"].is_string()
             ? choice["finish_reason"].get<std::string>()
             : "";
}

// A non-streamed chat request that must end in get_weather calls for `cities`; "" or what went wrong.
std::string expect_calls(GateClient& c, json body, const std::vector<std::string>& cities, int64_t& prompt_tokens) {
  JsonReply r = c.call("tools", "/v1/chat/completions", std::move(body));
  if (r.status != 200) return reply_failure(r);
  if (!r.body.contains("choices") || r.body["choices"].empty()) return "no choices in the answer";
  prompt_tokens = r.body.value("usage", json::object()).value("prompt_tokens", 0);
  const json& choice = r.body["choices"][0];
  const std::vector<Call> calls = message_calls(choice.value("message", json::object()));
  if (calls.empty()) return "no tool call (finish_reason " + finish_of(choice) + ")";
  if (std::string e = check_weather_calls(calls, cities); !e.empty()) return e;
  if (finish_of(choice) != "tool_calls") return "finish_reason `" + finish_of(choice) + "`, expected tool_calls";
  return "";
}

// The same, streamed: the calls are put together from their deltas, by index, as clients do.
std::string expect_streamed_call(GateClient& c, json body, const std::string& city) {
  body["stream"] = true;
  JsonReply r = c.call("tools", "/v1/chat/completions", std::move(body));
  if (r.status != 200) return reply_failure(r);
  std::map<int64_t, Call> calls;
  std::string finish;
  for (const auto& e : r.events) {
    if (!e.contains("choices") || !e["choices"].is_array() || e["choices"].empty()) continue;
    const json& choice = e["choices"][0];
    if (std::string f = finish_of(choice); !f.empty()) finish = f;
    const json delta = choice.value("delta", json::object());
    for (const auto& tc : delta.value("tool_calls", json::array())) {
      Call& call = calls[tc.value("index", int64_t{0})];
      const json f = tc.value("function", json::object());
      if (f.contains("name") && f["name"].is_string()) call.name += f["name"].get<std::string>();
      if (f.contains("arguments") && f["arguments"].is_string()) call.arguments += f["arguments"].get<std::string>();
    }
  }
  if (calls.empty())
    return "no tool-call deltas in " + std::to_string(r.events.size()) + " events (finish_reason " + finish + ")";
  std::vector<Call> list;
  for (auto& [_, call] : calls) list.push_back(call);
  if (std::string e = check_weather_calls(list, {city}); !e.empty()) return e;
  if (finish != "tool_calls") return "finish_reason `" + finish + "`, expected tool_calls";
  return "";
}

}  // namespace

GateResult gate_tools(GateClient& c) {
  GateResult g;
  g.name = "tools";
  std::mt19937_64 rng(20);
  const char* kinds[] = {"single", "parallel", "streaming", "tool-result continuation", "long-context"};
  for (int64_t i = 0; i < c.settings().tool_requests; ++i) {
    const std::string kind = kinds[i % 5];
    const std::string city = kCities[i % std::size(kCities)], other = kCities[(i + 3) % std::size(kCities)];
    const std::string ask = "What is the weather in " + city + " right now? Use the get_weather tool.";
    json body = c.chat({{{"role", "user"}, {"content", ask}}}, 256);
    body["tools"] = tools();
    body["tool_choice"] = "auto";
    std::string why;
    json detail = {{"case", kind + " #" + std::to_string(i / 5 + 1)}};
    int64_t prompt_tokens = 0;
    if (kind == "single") {
      why = expect_calls(c, body, {city}, prompt_tokens);
    } else if (kind == "parallel") {
      body["messages"][0]["content"] = "What is the weather in " + city + " and in " + other +
                                       "? Call get_weather once for each city, both calls at once.";
      body["parallel_tool_calls"] = true;
      why = expect_calls(c, body, {city, other}, prompt_tokens);
    } else if (kind == "streaming") {
      why = expect_streamed_call(c, body, city);
    } else if (kind == "long-context") {
      const int64_t depth = c.settings().tool_depth;
      body["messages"][0]["content"] = "Here are some notes:\n" + c.filler(depth, rng) + "\n\n" + ask;
      why = expect_calls(c, body, {city}, prompt_tokens);
      detail["target_depth"] = depth;
      detail["prompt_tokens"] = prompt_tokens;
    } else {
      // The tool's result is in: the model should answer from it, not call again.
      const json args = {{"city", city}};
      body["messages"].push_back(
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls", json::array({{{"id", "call_q1"},
                                        {"type", "function"},
                                        {"function", {{"name", "get_weather"}, {"arguments", args.dump()}}}}})}});
      body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_q1"}, {"content", "Sunny, 24 C"}});
      JsonReply r = c.call(g.name, "/v1/chat/completions", body);
      if (r.status != 200) {
        why = reply_failure(r);
      } else {
        const json& choice = r.body["choices"][0];
        const json message = choice.value("message", json::object());
        const std::string text =
            message.contains("content") && message["content"].is_string() ? message["content"].get<std::string>() : "";
        if (!message_calls(message).empty())
          why = "called a tool again instead of answering";
        else if (finish_of(choice) != "stop")
          why = "finish_reason `" + finish_of(choice) + "`, expected stop";
        else if (text.find("24") == std::string::npos)
          why = "the answer does not use the result (no `24`): " + utf8_prefix(text, 120);
      }
    }
    ++g.total;
    detail["pass"] = why.empty();
    if (why.empty())
      ++g.passed;
    else
      detail["why"] = why;
    g.details.push_back(detail);
  }
  g.finish();
  return g;
}

}  // namespace kiln::cli
