#include "server/api_error.h"

namespace kiln {

nlohmann::ordered_json ApiError::to_json() const {
  auto or_null = [](const std::string& s) {
    return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s);
  };
  return {{"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
}

std::string ApiError::dump() const {
  return to_json().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError api_error_from_status(const Status& status, std::string param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.code = "not_found";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kFailedPrecondition:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 400;
      e.code = "unsupported";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError generation_failed(const Status& why) {
  ApiError e;
  e.message = "generation failed: " + why.message();
  const bool gone = why.code() == StatusCode::kUnavailable;
  e.http_status = gone ? 503 : 500;
  e.type = gone ? "service_unavailable" : "server_error";
  return e;
}

}  // namespace kiln
