#include "server/response_format.h"

#include "server/structured_output.h"

namespace kiln {

using ojson = nlohmann::ordered_json;

std::optional<ApiError> read_response_format(const ServerContext& ctx, const ojson& format, const std::string& field,
                                             bool nested, const ReasoningPrefix& reasoning,
                                             GenerationRequest& request) {
  if (format.is_null()) return std::nullopt;
  if (!format.is_object())
    return bad_request("'" + field + "' must be an object, got " + json_type_phrase(format), field);
  const auto type_it = format.find("type");
  if (type_it == format.end() || !type_it->is_string())
    return bad_request("'" + field + ".type' is required: \"text\", \"json_object\" or \"json_schema\"",
                       field + ".type");
  const std::string type = type_it->get<std::string>();
  if (type == "text") return std::nullopt;
  if (type != "json_object" && type != "json_schema")
    return bad_request(
        "'" + field + ".type' must be \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"",
        field + ".type");
  if (!ctx.structured_output)
    return bad_request(field + " " + type +
                           ": constrained decoding runs on CPU recipes only for now (this model's device selects "
                           "tokens without grammar masks)",
                       field);
  Result<std::shared_ptr<TokenConstraint>> constraint = std::shared_ptr<TokenConstraint>();
  if (type == "json_object") {
    constraint = ctx.structured_output->json_object(reasoning);
    if (!constraint.ok()) return bad_request(field + ": " + constraint.status().message(), field);
  } else {
    const ojson* spec = &format;
    std::string where = field;
    if (nested) {
      where = field + ".json_schema";
      const auto it = format.find("json_schema");
      if (it == format.end() || !it->is_object())
        return bad_request("'" + where + "' is required with type \"json_schema\" and must be an object", where);
      spec = &*it;
    }
    const auto name = spec->find("name");
    if (name != spec->end() && !name->is_string())
      return bad_request("'" + where + ".name' must be a string, got " + json_type_phrase(*name), where + ".name");
    bool strict = false;
    if (const auto s = spec->find("strict"); s != spec->end() && !s->is_null()) {
      if (!s->is_boolean())
        return bad_request("'" + where + ".strict' must be a boolean, got " + json_type_phrase(*s), where + ".strict");
      strict = s->get<bool>();
    }
    const auto schema = spec->find("schema");
    if (schema == spec->end() || !(schema->is_object() || schema->is_boolean()))
      return bad_request("'" + where + ".schema' is required and must be a JSON schema object", where + ".schema");
    constraint = ctx.structured_output->json_schema(*schema, strict, reasoning);
    if (!constraint.ok())
      return bad_request("'" + where + ".schema' cannot be enforced: " + constraint.status().message(),
                         where + ".schema");
  }
  request.params.constraint = std::move(constraint).value();
  request.constraint_after_reasoning = reasoning.enabled;
  return std::nullopt;
}

}  // namespace kiln
