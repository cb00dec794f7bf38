#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

namespace kiln {

Result<Normalizer> Normalizer::from_json(const nlohmann::json& json, const std::string& field) {
  Normalizer normalizer;
  if (json.is_null()) return normalizer;
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return data_loss(field + ": expected null or an object with a string \"type\"");
  }
  const std::string type = json["type"].get<std::string>();
  if (type == "NFC") {
    normalizer.nfc_ = true;
    return normalizer;
  }
  if (type == "Sequence" && json.contains("normalizers") && json["normalizers"].is_array()) {
    for (std::size_t i = 0; i < json["normalizers"].size(); ++i) {
      KILN_ASSIGN_OR_RETURN(Normalizer step,
                            from_json(json["normalizers"][i], field + ".normalizers[" + std::to_string(i) + "]"));
      normalizer.nfc_ = normalizer.nfc_ || step.nfc_;
    }
    return normalizer;
  }
  return unimplemented(field + ".type: normalizer '" + type + "' is not supported (supported: null, NFC)");
}

std::string Normalizer::apply(const std::string& text) const {
  if (!nfc_ || text.empty()) return text;
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) return text;  // only on invalid UTF-8, which the tokenizer never passes
  std::string out(reinterpret_cast<const char*>(composed), static_cast<std::size_t>(length));
  std::free(composed);
  return out;
}

}  // namespace kiln
