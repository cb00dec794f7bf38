// What this example library provides, one source file each; example_plugin.cpp registers them.
#pragma once

#include <memory>

#include "kiln/drafter.h"
#include "kiln/kv_layout.h"
#include "kiln/plugin.h"

namespace example_plugin {

// ngram_drafter.cpp: the `ngram` drafter and the key it adds to [speculative].
kiln::Result<std::unique_ptr<kiln::Drafter>> make_ngram_drafter(const kiln::CreateContext& ctx);
kiln::SectionSchema ngram_drafter_schema();

// bf16_copy_kv_layout.cpp: the `bf16-copy` KV layout on the device `ctx` names, and the devices this build has.
kiln::Result<std::unique_ptr<kiln::KvLayout>> make_bf16_copy_layout(const kiln::CreateContext& ctx);
kiln::DeviceSet bf16_copy_devices();

}  // namespace example_plugin
