// The needle gate of `kiln qualify`: one sentence hidden in filler at each target depth, the answer must repeat its
// passphrase exactly (nothing else but whitespace, quotes and a final period). The filler is random common words, so
// nothing but the needle states a passphrase, and the passphrase (a word and four digits) cannot be guessed from the
// prompt's other text.
#include <algorithm>

#include "qualify_gates.h"
#include "utf8_prefix.h"

namespace kiln::cli {
namespace {

std::string strip(std::string s) {
  const char* kAround = " \t\r\n\"'`*.";
  s.erase(0, s.find_first_not_of(kAround));
  const size_t last = s.find_last_not_of(kAround);
  s.erase(last == std::string::npos ? 0 : last + 1);
  return s;
}

}  // namespace

GateResult gate_needle(GateClient& c) {
  using nlohmann::json;
  GateResult g;
  g.name = "needle";
  std::mt19937_64 rng(42);
  const char* kWords[] = {"amber", "cobalt", "falcon", "juniper", "quartz", "saffron", "tundra", "violet"};
  const double kPositions[] = {0.5, 0.25, 0.75};  // where in the filler the needle sits, in turn
  const auto& depths = c.settings().needle_depths;
  for (size_t i = 0; i < depths.size(); ++i) {
    const int64_t depth = depths[i];
    const std::string passphrase =
        std::string(kWords[rng() % std::size(kWords)]) + "-" + std::to_string(1000 + rng() % 9000);
    const double at = kPositions[i % std::size(kPositions)];
    // The instructions and question take ~60 tokens of the target.
    const int64_t filler_tokens = std::max<int64_t>(16, depth - 60);
    const std::string before = c.filler(static_cast<int64_t>(filler_tokens * at), rng);
    const std::string after = c.filler(filler_tokens - static_cast<int64_t>(filler_tokens * at), rng);
    const std::string prompt = "Read the notes below. Somewhere in them is a secret passphrase.\n\n" + before +
                               ". The secret passphrase is " + passphrase + ". " + after +
                               "\n\nWhat is the secret passphrase? Reply with the passphrase only.";
    JsonReply r = c.call(g.name, "/v1/chat/completions", c.chat({{{"role", "user"}, {"content", prompt}}}, 32));
    json detail = {{"case", "depth " + std::to_string(depth)},
                   {"target_depth", depth},
                   {"position", at},
                   {"passphrase", passphrase}};
    std::string why;
    if (r.status != 200) {
      why = reply_failure(r);
    } else {
      const json message = r.body["choices"][0].value("message", json::object());
      const std::string answer =
          message.contains("content") && message["content"].is_string() ? message["content"].get<std::string>() : "";
      detail["prompt_tokens"] = r.body.value("usage", json::object()).value("prompt_tokens", 0);
      detail["answer"] = utf8_prefix(answer, 200);
      // Exact match, as asked ("the passphrase only"): whitespace, quotes, emphasis and a final period aside.
      const std::string bare = strip(answer);
      if (bare != passphrase)
        why = answer.find(passphrase) != std::string::npos
                  ? "answered with the passphrase among other text: `" + utf8_prefix(answer, 80) + "`"
                  : "answered `" + utf8_prefix(answer, 60) + "`, not " + passphrase;
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
