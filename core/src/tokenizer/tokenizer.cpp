#include "tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bounded_json.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace kiln {

using Json = nlohmann::json;

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  AddedVocabulary added;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  int64_t vocab_size = 0;
};

namespace {

Status check_decoder(const Json& json) {
  if (!json.contains("decoder") || json["decoder"].is_null()) return ok_status();
  const Json& decoder = json["decoder"];
  if (!decoder.is_object() || !decoder.contains("type") || !decoder["type"].is_string()) {
    return data_loss("decoder: expected null or an object with a string \"type\"");
  }
  if (decoder["type"] != "ByteLevel") {
    return unimplemented("decoder.type: decoder '" + decoder["type"].get<std::string>() +
                         "' is not supported (only ByteLevel)");
  }
  return ok_status();
}

Result<std::unique_ptr<Tokenizer::Impl>> build(const Json& json) {
  if (!json.is_object()) return data_loss("top level: expected a JSON object");
  auto impl = std::make_unique<Tokenizer::Impl>();
  if (!json.contains("model")) return data_loss("model: missing");
  KILN_ASSIGN_OR_RETURN(impl->model, BpeModel::from_json(json["model"], "model"));
  KILN_ASSIGN_OR_RETURN(impl->normalizer, Normalizer::from_json(json.value("normalizer", Json()), "normalizer"));
  KILN_ASSIGN_OR_RETURN(impl->pre_tokenizer,
                        PreTokenizer::from_json(json.value("pre_tokenizer", Json()), "pre_tokenizer"));
  KILN_RETURN_IF_ERROR(check_decoder(json));
  const Normalizer& normalizer = impl->normalizer;
  KILN_ASSIGN_OR_RETURN(impl->added,
                        AddedVocabulary::from_json(json.value("added_tokens", Json()), "added_tokens",
                                                   [&](const std::string& s) { return normalizer.apply(s); }));
  impl->vocab_size = impl->model->max_id() + 1;
  // Serving sizes per-token tables (grammar masks, logit rows) by the vocabulary; an added token far past the model's
  // ids would make them gigabytes. Checkpoints add a few hundred special ids right after the vocabulary.
  const int64_t added_limit = impl->vocab_size + (int64_t{1} << 20);
  for (std::size_t i = 0; i < impl->added.tokens().size(); ++i) {
    const AddedToken& token = impl->added.tokens()[i];
    if (token.id >= added_limit) {
      return data_loss("added_tokens[" + std::to_string(i) + "].id: " + std::to_string(token.id) +
                       " is more than 2^20 past the model vocabulary's last id " +
                       std::to_string(impl->vocab_size - 1));
    }
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, int64_t{token.id} + 1);
  }
  return impl;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, const std::string& source_name) {
  Json json;
  // Bounded nesting (bounded_json.h): the normalizer and pre-tokenizer readers recurse into nested "Sequence"
  // entries, so a hostile file nested thousands deep would overflow the stack where no catch helps.
  std::string error;
  if (!parse_bounded_json(json_text, json, error)) return data_loss(source_name + ": not valid JSON: " + error);
  try {
    auto impl = build(json);
    if (!impl.ok()) return impl.status().with_context(source_name);
    return Tokenizer(std::shared_ptr<const Impl>(std::move(impl).value()));
  } catch (const Json::exception& e) {
    return data_loss(source_name + ": unexpected JSON shape: " + e.what());
  }
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) return not_found("cannot open tokenizer file '" + tokenizer_json.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), "'" + tokenizer_json.string() + "'");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const PromptPiece piece{std::string(text), !parse_special};
  return encode(std::span(&piece, 1));
}

std::vector<int32_t> Tokenizer::encode(std::span<const PromptPiece> prompt) const {
  const Impl& impl = *impl_;
  std::vector<TextSegment> segments;
  for (const PromptPiece& piece : prompt) {
    if (piece.text.empty()) continue;
    // Each piece is made valid on its own, so invalid bytes never merge with a neighbour into a character.
    segments.push_back(
        {utf8::is_valid(piece.text) ? piece.text : utf8::to_valid_lossy(piece.text), -1, !piece.client_text});
  }
  impl.added.split(segments, /*normalized=*/false);
  if (!impl.normalizer.is_identity()) {
    for (TextSegment& segment : segments) {
      if (segment.id < 0) segment.text = impl.normalizer.apply(segment.text);
    }
  }
  impl.added.split(segments, /*normalized=*/true);

  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].id >= 0) {
      ids.push_back(segments[i].id);
      continue;
    }
    // Text between two added tokens is pre-tokenized as one run, whichever pieces it came from.
    std::string text = std::move(segments[i].text);
    while (i + 1 < segments.size() && segments[i + 1].id < 0) text += segments[++i].text;
    pieces.clear();
    impl.pre_tokenizer.split(text, pieces);
    for (const std::string& piece : pieces) impl.model->tokenize(piece, ids);
  }
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  std::string bytes;
  if (const AddedToken* added = impl_->added.find(id)) {
    byte_level::decode_token(added->content, bytes);
  } else {
    byte_level::decode_token(impl_->model->id_to_token(id), bytes);
  }
  return bytes;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    if (const AddedToken* added = impl_->added.find(id)) {
      byte_level::decode_token(added->content, bytes);
    } else {
      byte_level::decode_token(impl_->model->id_to_token(id), bytes);
    }
  }
  return utf8::to_valid_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* added = impl_->added.find(token)) return added->id;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = impl_->added.find(id)) return added->content;
  return impl_->model->id_to_token(id);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = impl_->added.find(id);
  return added != nullptr && added->special;
}

std::vector<std::string> Tokenizer::special_token_texts() const {
  std::vector<std::string> out;
  for (const AddedToken& t : impl_->added.tokens())
    if (t.special) out.push_back(t.content);
  return out;
}

}  // namespace kiln
