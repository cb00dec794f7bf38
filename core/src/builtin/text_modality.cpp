#include "builtin/text_modality.h"

namespace kiln::builtin {
namespace {

class TextModality final : public Modality {
 public:
  std::vector<std::string> accepted_mime_types() const override { return {}; }

  Result<MediaEmbedding> encode(const MediaItem& item, Stream) override {
    return unimplemented("the `text` modality accepts no media (got " +
                         (item.mime_type.empty() ? std::string("an item without a MIME type") : item.mime_type) +
                         "); set `[media] modality = \"image\"` (plugin vision) to send images");
  }
};

}  // namespace

Result<std::unique_ptr<Modality>> create_text_modality(const CreateContext&) {
  return std::unique_ptr<Modality>(new TextModality());
}

}  // namespace kiln::builtin
