// OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the HTTP status they travel with.
// Clients (the openai package, LangChain, curl users) branch on the status and read `message`/`param`, so every
// refusal names the field at fault.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kiln/status.h"

namespace kiln {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; empty = null
  std::string code;   // machine-readable reason; empty = null

  nlohmann::ordered_json to_json() const;
  // The response body. A message may quote client bytes (a JSON parse error quotes the last bytes read, which
  // can be half a UTF-8 character): those become U+FFFD rather than an exception.
  std::string dump() const;
};

ApiError bad_request(std::string message, std::string param = "");
// Engine/tokenizer Status → HTTP: invalid argument 400, not found 404, resource exhausted 429, unavailable 503.
ApiError api_error_from_status(const Status& status, std::string param = "");
// A generation the engine ended with an error (TokenEvent::error_code): 503 when a device or peer is gone — a broken
// tensor-parallel group, nothing the request did and nothing a retry fixes before kiln restarts — else 500 (a fault
// of kiln). The message names the cause.
ApiError generation_failed(const Status& why);

}  // namespace kiln
