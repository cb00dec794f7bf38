#include "server/media_input.h"

#include "server/media_fetch.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

namespace kiln {

std::optional<ApiError> decode_data_url(const std::string& url, const std::string& field, MediaItem& item) {
  const std::string url_field = field + ".image_url.url";
  if (url.rfind("data:", 0) != 0) {
    return bad_request(url_field + ": only data: URLs (\"data:image/png;base64,...\") are accepted; the server "
                                   "fetches nothing over the network",
                       url_field);
  }
  const std::size_t comma = url.find(',');
  const std::string header = url.substr(5, comma == std::string::npos ? std::string::npos : comma - 5);
  const std::string suffix = ";base64";
  if (comma == std::string::npos || header.size() < suffix.size() ||
      header.compare(header.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return bad_request(url_field + ": expected \"data:<mime type>;base64,<data>\"", url_field);
  }
  item.mime_type = header.substr(0, header.size() - suffix.size());
  std::string data = url.substr(comma + 1);
  data.erase(std::remove_if(data.begin(), data.end(), [](char c) { return c == '\n' || c == '\r' || c == ' '; }),
             data.end());
  if (data.empty() || data.size() % 4 != 0)
    return bad_request(url_field + ": the base64 data is empty or not a whole number of 4-character groups", url_field);
  item.bytes.resize(data.size() / 4 * 3);
  // EVP_DecodeBlock decodes whole groups and counts '=' padding as zero bytes, which are dropped after.
  const int n = EVP_DecodeBlock(item.bytes.data(), reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size()));
  if (n < 0) return bad_request(url_field + ": the data is not valid base64", url_field);
  std::size_t padding = 0;
  for (std::size_t i = data.size(); i > 0 && data[i - 1] == '=' && padding < 2; --i) ++padding;
  item.bytes.resize(static_cast<std::size_t>(n) - padding);
  return std::nullopt;
}

uint64_t media_content_hash(const MediaItem& item) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, item.mime_type.data(), item.mime_type.size());
  EVP_DigestUpdate(ctx, "", 1);  // the type's end, so no (type, bytes) pair reads as another
  EVP_DigestUpdate(ctx, item.bytes.data(), item.bytes.size());
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  uint64_t h = 0;
  std::memcpy(&h, digest, sizeof h);
  return h == 0 ? 1 : h;  // 0 means "no media" in the block hashes
}

std::optional<ApiError> MediaInput::build_prompt(const Tokenizer& tokenizer, std::span<const PromptPiece> pieces,
                                                 std::span<const ChatMedia> media, std::vector<int32_t>& prompt,
                                                 std::vector<RequestMedia>& spans) {
  prompt.clear();
  spans.clear();
  if (!media.empty()) {
    const std::string& first = media.front().field;
    if (!options_.modality)
      return bad_request(first + ": this server takes no media", first);
    if (static_cast<int64_t>(media.size()) > options_.max_images) {
      // Named by the first part over the limit, so the client sees which image to drop.
      const std::string& over = media[static_cast<std::size_t>(std::max<int64_t>(options_.max_images, 0))].field;
      return bad_request(over + ": the request has " + std::to_string(media.size()) +
                             " images; this server takes at most " + std::to_string(options_.max_images) +
                             " (media.max_images)",
                         over);
    }
  }
  std::vector<MediaEmbedding> encoded(media.size());
  std::vector<uint64_t> hashes(media.size());
  std::vector<MediaItem> items(media.size());
  const std::vector<std::string> types = options_.modality ? options_.modality->accepted_mime_types()
                                                           : std::vector<std::string>{};
  for (std::size_t i = 0; i < media.size(); ++i) {
    const ChatMedia& m = media[i];
    MediaItem& item = items[i];
    if (auto e = is_remote_url(m.url) ? fetch_remote_media(m.url, m.field, options_.remote, item)
                                      : decode_data_url(m.url, m.field, item))
      return e;
    if (std::find(types.begin(), types.end(), item.mime_type) == types.end()) {
      std::string accepted;
      for (const std::string& t : types) accepted += (accepted.empty() ? "" : ", ") + t;
      return bad_request(m.field + ": " + (item.mime_type.empty() ? "an item without a MIME type" : item.mime_type) +
                             " is not a type the modality `" + options_.modality_name + "` takes (" +
                             (accepted.empty() ? "it accepts no media; serve a recipe whose media.modality is an image "
                                                 "plugin"
                                               : accepted) +
                             ")",
                         m.field);
    }
    hashes[i] = media_content_hash(item);
  }
  // All of a request's items in one call: the modality may decode them in parallel and batch its encoder.
  std::vector<Result<MediaEmbedding>> results;
  if (!items.empty()) {
    std::lock_guard<std::mutex> lock(encode_mutex_);
    results = options_.modality->encode_all(items, options_.stream);
  }
  if (results.size() != items.size())
    return api_error_from_status(internal_error("the modality `" + options_.modality_name + "` returned " +
                                                std::to_string(results.size()) + " results for " +
                                                std::to_string(items.size()) + " items"));
  for (std::size_t i = 0; i < media.size(); ++i) {
    const ChatMedia& m = media[i];
    Result<MediaEmbedding>& e = results[i];
    if (!e.ok()) return bad_request(m.field + ": " + e.status().message(), m.field);
    const MediaEmbedding& emb = *e;
    if (emb.tokens.empty() || emb.first_placeholder < 0 || emb.num_embeddings < 0 ||
        emb.first_placeholder + emb.num_embeddings > static_cast<int64_t>(emb.tokens.size()) ||
        static_cast<int64_t>(emb.embeddings.size()) != emb.num_embeddings * options_.hidden_size) {
      return api_error_from_status(internal_error("the modality `" + options_.modality_name + "` returned " +
                                                  std::to_string(emb.tokens.size()) + " tokens with placeholders [" +
                                                  std::to_string(emb.first_placeholder) + ", +" +
                                                  std::to_string(emb.num_embeddings) + ") and " +
                                                  std::to_string(emb.embeddings.size()) + " values for rows of " +
                                                  std::to_string(options_.hidden_size)));
    }
    encoded[i] = std::move(e).value();
  }
  // Text runs between media pieces are tokenized as runs (BPE sees the same words as without media).
  std::vector<PromptPiece> run;
  auto flush = [&] {
    const std::vector<int32_t> ids = tokenizer.encode(run);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
    run.clear();
  };
  for (const PromptPiece& piece : pieces) {
    if (piece.media < 0) {
      run.push_back(piece);
      continue;
    }
    flush();
    if (piece.media >= static_cast<int32_t>(encoded.size()))
      return api_error_from_status(internal_error("the prompt names media item " + std::to_string(piece.media) +
                                                  " of " + std::to_string(encoded.size())));
    MediaEmbedding& emb = encoded[piece.media];
    RequestMedia span;
    span.position = static_cast<int64_t>(prompt.size());
    span.length = static_cast<int64_t>(emb.tokens.size());
    span.first_placeholder = emb.first_placeholder;
    span.num_embeddings = emb.num_embeddings;
    span.embeddings = std::move(emb.embeddings);
    span.hash = hashes[piece.media];
    prompt.insert(prompt.end(), emb.tokens.begin(), emb.tokens.end());
    spans.push_back(std::move(span));
  }
  flush();
  return std::nullopt;
}

}  // namespace kiln
