// A request body → the route's parsing, prompt building and tokenisation, then its response shapes. The first
// byte picks the route. Any exception escaping is a crash: the server would answer it with a 500.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "server/chat_completions_route.h"
#include "server/completions_route.h"
#include "server/request_reader.h"
#include "server/responses_route.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size == 0) return 0;
  static const ServerContext ctx = [] {
    ServerContext c;
    c.tokenizer = &fuzz::fixture_tokenizer();
    c.model_id = "/models/tiny";
    c.served_name = "tiny";
    c.max_model_len = 4096;
    c.max_output_tokens = 1024;
    c.tool_parser = "glm47";
    c.reasoning_parser = "glm45";
    return c;
  }();
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  nlohmann::ordered_json json;
  ApiError error;
  if (!parse_json_body(body, &json, &error)) {
    (void)error.dump();
    return 0;
  }
  PreparedGeneration prepared;
  std::optional<ApiError> refused;
  switch (data[0] % 3) {
    case 0:
      refused = prepare_chat_completion(ctx, json, prepared);
      break;
    case 1:
      refused = prepare_completion(ctx, json, prepared);
      break;
    default:
      refused = prepare_response(ctx, json, prepared);
      break;
  }
  if (refused) {
    fuzz::check(refused->http_status >= 400 && refused->http_status < 500, "a refused request is a 4xx");
    (void)refused->dump();
    return 0;
  }
  fuzz::check(!prepared.request.params.prompt.empty(), "an accepted request has a prompt");
  GenerationResult result;
  result.finish_reason = "stop";
  (void)prepared.writer->stream_begin();
  (void)prepared.writer->stream_end(result);
  (void)prepared.writer->complete({}, result).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return 0;
}
