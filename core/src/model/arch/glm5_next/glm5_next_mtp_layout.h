// The structure of glm5_next's next-n (MTP) layers, read from the checkpoint's tensor names. transformers does not
// model the layer (specs/glm5-next.md §7: `layers.45.*` and `shared_head` are dropped on load), so no config field
// says whether it holds a KDA or a DSA attention, hyper-connection streams, an MLP or a MoE: the names do.
//
// The layout is read when the architecture is parsed beside its checkpoint (parse_glm5_next), not when the weights
// load, because the engine sizes the caches (Architecture::cache_spec) from the architecture alone and a KDA layer
// caches per-sequence state where a DSA one caches paged latents.
#pragma once

#include <string>
#include <vector>

#include "model/arch/glm5_next/glm5_next_config.h"

namespace kiln::glm5_next {

// Fills c.mtp with the layouts of the next-n layers present among `names` (every tensor name of the checkpoint):
// layers num_hidden_layers + i for i < num_nextn_predict_layers (when config.json gives it; otherwise as many as
// are stored), stopping at the first one absent. A present layer whose names fit no known layout stops the scan
// and sets c.mtp_refusal to a message listing the names it found (experts collapsed to `experts.*`).
void read_mtp_layouts(const std::vector<std::string>& names, Glm5NextConfig& c);

}  // namespace kiln::glm5_next
