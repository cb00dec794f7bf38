// The plugin's one descriptor: a library may register any number of capabilities, of any kinds.
#include "example_plugin.h"

namespace {

kiln::Status register_example(kiln::Registrar& registrar) {
  KILN_RETURN_IF_ERROR(registrar.add<kiln::Drafter>(
      "ngram", "prompt-lookup drafter (no model; example plugin)", &example_plugin::make_ngram_drafter,
      kiln::DeviceSet::cpu_and_cuda(), example_plugin::ngram_drafter_schema()));
  // [kv] block_size is the core's key (it pages every layout), so the layout adds none.
  return registrar.add<kiln::KvLayout>(
      "bf16-copy", "MLA cache of bf16 rows like the built-in `bf16`, with its own kernels (example plugin)",
      &example_plugin::make_bf16_copy_layout, example_plugin::bf16_copy_devices());
}

}  // namespace

KILN_PLUGIN(
    "example", "0.2.0",
    "example out-of-tree plugin: an n-gram prompt-lookup drafter and a bf16 KV layout with its own CUDA kernels",
    &register_example)
