// The plugin ABI: version numbers, the descriptor every plugin exports, and the registrar through which
// it registers factories for the six capability kinds.
//
// A plugin is a MODULE library exporting one alias, `kiln_plugin_descriptor`, that returns a pointer to a
// POD KilnPluginDescriptor. The loader checks abi_major (must equal the host's), struct_size (lets minor
// versions append fields) and abi_tag (the C++ ABI: factories return C++ objects, so plugin and host must
// agree on the standard library ABI). Then it calls register_fn once.
#pragma once

#include <cstdint>
#include <memory>

#include <boost/dll/alias.hpp>

#include "kiln/device.h"
#include "kiln/model_info.h"
#include "kiln/recipe.h"
#include "kiln/status.h"

// 2.0: device-aware interfaces (Linear / ExpertSet / KvLayout run on CPU or CUDA with a plan/run split, drafters
//      get DraftServices on the device and return sparse q, registrations declare their devices).
// 2.1: the `quantizer` kind (kiln/quantizer.h), appended; a 2.0 host refuses a 2.1 plugin as newer than itself.
// 2.2: DraftServices::mtp_run_device_tokens (appended virtual), so drafters chain next-n steps on the device;
//      ModelInfo::checkpoint_dir (appended), so a modality finds its tower's weights.
// 2.3: ModelInfo::synthetic_weights and weight_seed (appended), so a modality makes its tower randomly under
//      model.load = "dummy" as the core does the model's weights.
// 2.4: KvLayout::indexer_key_format (appended virtual), so a layout stores the DSA indexer's keys in its precision
//      (fp8_ds_mla: e4m3 + an fp32 scale); kv_layout plugins built before 2.4 are refused (the host calls it).
// 2.5: CreateContext::dense_weights (appended): a quantized weight format serves the modules a checkpoint stores
//      dense through the built-in `dense` format (its kernels, fused epilogues, folded shared expert) instead of a
//      path of its own. Plugins built before 2.5 never read it; a 2.5 plugin is refused by an older kiln.
// 2.6: Collective::all_reduce_moe_combine_norm (appended virtual, MoeCombineNorm), so a collective fuses the MoE
//      block's tensor-parallel sum with the combine, residual add and next RMSNorm (kiln/cuda/moe_combine_norm_row.cuh
//      is the row body both sides share); collective plugins built before 2.6 are refused (the host calls it).
// 2.7: MlaAttendArgs::out_lse (appended), so decode-context parallelism on GPUs merges the attention of ranks that
//      each hold part of a sequence's KV; kv_layout plugins built before 2.7 are refused (they would ignore it).
// 2.8: kKvFuseQueriesBf16Only (a new KvAppendFusion bit; older layouts never return it) and KvAppendArgs::q_abs
//      null under it: prefill-only steps ask for the queries in bf16 alone.
#define KILN_ABI_MAJOR 2
#define KILN_ABI_MINOR 8

#define KILN_STRINGIFY_INNER_(x) #x
#define KILN_STRINGIFY_(x) KILN_STRINGIFY_INNER_(x)

// Identifies the C++ ABI a library was built for. Itanium ABI version + which std::string/std::list
// layout libstdc++ uses (or libc++). Two builds with different tags cannot share std:: types.
#if defined(_LIBCPP_VERSION)
#define KILN_STDLIB_TAG_ "libc++"
#elif defined(_GLIBCXX_USE_CXX11_ABI)
#define KILN_STDLIB_TAG_ "libstdc++-cxx11abi" KILN_STRINGIFY_(_GLIBCXX_USE_CXX11_ABI)
#else
#define KILN_STDLIB_TAG_ "unknown-stdlib"
#endif
#if defined(__GXX_ABI_VERSION)
#define KILN_ABI_TAG "itanium-" KILN_STRINGIFY_(__GXX_ABI_VERSION) ";" KILN_STDLIB_TAG_
#else
#define KILN_ABI_TAG "msvc;" KILN_STDLIB_TAG_
#endif

#define KILN_PLUGIN_ENTRY_ALIAS "kiln_plugin_descriptor"

namespace kiln {

// New kinds go at the end so every existing kind keeps its number across plugins built against older SDKs.
enum class PluginKind : uint32_t { kWeightFormat = 0, kKvLayout, kDrafter, kCollective, kModality, kQuantizer };
constexpr int kNumPluginKinds = 6;

inline const char* plugin_kind_name(PluginKind k) {
  switch (k) {
    case PluginKind::kWeightFormat: return "weight_format";
    case PluginKind::kKvLayout: return "kv_layout";
    case PluginKind::kDrafter: return "drafter";
    case PluginKind::kCollective: return "collective";
    case PluginKind::kModality: return "modality";
    case PluginKind::kQuantizer: return "quantizer";
  }
  return "?";
}

class DeviceContext;  // kiln/device_context.h
class DraftServices;  // kiln/draft_services.h
class WeightFormat;   // kiln/weight_format.h

// What a factory is given: its own recipe section (already validated against the schema it registered),
// the device to create on with the core's services for it, and the model's dimensions (null where no model is
// loaded, e.g. `kiln plugins`).
struct CreateContext {
  const RecipeSection* section = nullptr;
  Device device;
  const ModelInfo* model = nullptr;
  // Memory, stream and copies on `device` (null where nothing will run, e.g. `kiln recipe check`).
  DeviceContext* device_context = nullptr;
  // For drafters: the target's embedding, lm_head, next-n layers, device sampling, checkpoint loading (null
  // where the engine offers none).
  DraftServices* draft_services = nullptr;
  // For weight formats other than `dense`: the built-in `dense` format on the same device, for the modules a
  // checkpoint stores unquantized (null where none is offered, e.g. `kiln recipe check`).
  WeightFormat* dense_weights = nullptr;
};

template <class Interface>
using Factory = Result<std::unique_ptr<Interface>> (*)(const CreateContext&);

class Registrar {
 public:
  // Registers `Interface` (WeightFormat, KvLayout, Drafter, Collective, Modality, Quantizer) under `name`, implemented on
  // `devices`. `schema` lists the keys this implementation adds to its recipe section.
  template <class Interface>
  Status add(const char* name, const char* description, Factory<Interface> factory, DeviceSet devices,
             SectionSchema schema = {}) {
    return add_erased(Interface::kKind, name, description, reinterpret_cast<ErasedFactory>(factory), devices,
                      std::move(schema));
  }

 protected:
  using ErasedFactory = void (*)();
  virtual ~Registrar() = default;
  virtual Status add_erased(PluginKind kind, const char* name, const char* description, ErasedFactory factory,
                            DeviceSet devices, SectionSchema schema) = 0;
};

}  // namespace kiln

extern "C" {
// Fields may only be appended (abi_minor bump); struct_size tells the host how many the plugin has.
struct KilnPluginDescriptor {
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t struct_size;
  const char* name;
  const char* version;
  const char* abi_tag;
  const char* description;
  kiln::Status (*register_fn)(kiln::Registrar&);
};
}

// Declares this library's descriptor and exports it. Use once per plugin, at namespace scope:
//   KILN_PLUGIN("quant-exl3", "0.1.0", "EXL3 trellis-quantized weights", register_exl3)
#define KILN_PLUGIN(name, version, description, register_fn)                                           \
  namespace kiln_plugin_entry_ {                                                                     \
  const KilnPluginDescriptor* descriptor() {                                                          \
    static const KilnPluginDescriptor d = {KILN_ABI_MAJOR, KILN_ABI_MINOR, sizeof(KilnPluginDescriptor), \
                                           name,           version,        KILN_ABI_TAG,                 \
                                           description,    register_fn};                                 \
    return &d;                                                                                        \
  }                                                                                                   \
  }                                                                                                   \
  BOOST_DLL_ALIAS(kiln_plugin_entry_::descriptor, kiln_plugin_descriptor)
