// Modality: turns media (an image, a video) into embeddings that replace placeholder tokens in the prompt.
// `text` (built in) accepts no media; `vision` is a plugin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

namespace kiln {

struct MediaItem {
  std::string mime_type;  // "image/png", "image/jpeg", ...
  std::vector<uint8_t> bytes;
};

struct MediaEmbedding {
  std::vector<int32_t> tokens;   // the prompt tokens standing for this item (start, placeholders, end)
  int64_t num_embeddings = 0;    // how many placeholder positions take rows of `embeddings`
  std::vector<float> embeddings; // [num_embeddings, hidden]
};

class Modality {
 public:
  static constexpr PluginKind kKind = PluginKind::kModality;
  virtual ~Modality() = default;
  virtual std::vector<std::string> accepted_mime_types() const = 0;
  virtual Result<MediaEmbedding> encode(const MediaItem& item, Stream stream) = 0;
};

}  // namespace kiln
