// Media parts of a request on their way to the engine: each image part's data: URL decoded, checked against the
// recipe's modality (its MIME types, media.max_images) and encoded by it into the placeholder tokens and embedding
// rows the step scatters; a content hash of each item joins the prefix-cache keys of the blocks holding its tokens.
// http(s) URLs are fetched only when the recipe allows them (server/media_fetch.h). Client mistakes (a remote URL
// the recipe does not allow or that fails, bad base64, a type the modality does not take, too many images) are 400s naming
// the part; so is anything the modality refuses.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine_api.h"
#include "kiln/modality.h"
#include "server/api_error.h"
#include "server/media_fetch.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct MediaInputOptions {
  std::shared_ptr<Modality> modality;  // null: the server takes no media
  std::string modality_name = "text";  // media.modality, for messages
  int64_t max_images = 16;             // media.max_images
  Stream stream;                       // the model's device stream, for encode()
  int64_t hidden_size = 0;             // the width of the rows a modality must return
  RemoteMediaOptions remote;           // http(s) image URLs: off unless media.remote_urls
};

// A data: URL's MIME type and bytes ("data:image/png;base64,..."); an error names `field` for anything else.
std::optional<ApiError> decode_data_url(const std::string& url, const std::string& field, MediaItem& item);

// First 8 bytes of SHA-256 over the MIME type and the bytes: the item's identity in the prefix cache.
uint64_t media_content_hash(const MediaItem& item);

class MediaInput {
 public:
  explicit MediaInput(MediaInputOptions options) : options_(std::move(options)) {}

  // Encodes `media` (in index order) and builds the prompt: text pieces tokenized, each media piece replaced by its
  // item's tokens, with the spans the engine needs in `spans`. Modalities are called one at a time.
  std::optional<ApiError> build_prompt(const Tokenizer& tokenizer, std::span<const PromptPiece> pieces,
                                       std::span<const ChatMedia> media, std::vector<int32_t>& prompt,
                                       std::vector<RequestMedia>& spans);

 private:
  MediaInputOptions options_;
  std::mutex encode_mutex_;
};

}  // namespace kiln
