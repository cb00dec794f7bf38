// Modality: turns media (an image, a video) into embeddings that replace placeholder tokens in the prompt.
// `text` (built in) accepts no media; `vision` is a plugin.
//
// The request path: the server hands each media part of a request to the recipe's modality, which returns the
// prompt tokens standing for it and the embedding rows for its placeholders. The engine keeps them with the
// sequence; the step that computes a placeholder's position takes its row instead of the token's embedding (the
// embedding-override scatter), and the prefix cache keys the blocks holding an item's tokens by the item's
// content hash as well, so a different image behind the same placeholder tokens never shares KV.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

struct MediaItem {
  std::string mime_type;  // "image/png", "image/jpeg", ...
  std::vector<uint8_t> bytes;
};

struct MediaEmbedding {
  // The prompt tokens standing for this item (e.g. begin marker, placeholders, end marker).
  std::vector<int32_t> tokens;
  // tokens[first_placeholder .. first_placeholder + num_embeddings) take the embedding rows, in order.
  int64_t first_placeholder = 0;
  int64_t num_embeddings = 0;
  std::vector<float> embeddings;  // host [num_embeddings, hidden_size] fp32
};

class Modality {
 public:
  static constexpr PluginKind kKind = PluginKind::kModality;
  virtual ~Modality() = default;
  virtual std::vector<std::string> accepted_mime_types() const = 0;
  // Whether it takes video (`media.video = true` needs a modality that does).
  virtual bool accepts_video() const { return false; }
  virtual Result<MediaEmbedding> encode(const MediaItem& item, Stream stream) = 0;
  // A request's items at once (ABI 2.4), results in order, each succeeding or failing on its own: a modality may
  // decode them in parallel and run its encoder over several together. The default encodes one after another.
  virtual std::vector<Result<MediaEmbedding>> encode_all(std::span<const MediaItem> items, Stream stream) {
    std::vector<Result<MediaEmbedding>> out;
    out.reserve(items.size());
    for (const MediaItem& item : items) out.push_back(encode(item, stream));
    return out;
  }
};

}  // namespace kiln
