// The normalizer of a tokenizer.json. Supported: null (none), NFC, and a Sequence of NFC steps; anything
// else is refused at load time with the field named, since silently skipping it would change the ids.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kiln/status.h"

namespace kiln {

class Normalizer {
 public:
  static Result<Normalizer> from_json(const nlohmann::json& json, const std::string& field);

  // `text` must be valid UTF-8.
  std::string apply(const std::string& text) const;
  bool is_identity() const { return !nfc_; }

 private:
  bool nfc_ = false;
};

}  // namespace kiln
