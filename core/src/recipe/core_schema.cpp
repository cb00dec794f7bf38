#include "recipe/core_schema.h"

namespace kiln {
namespace {

KeySpec str(std::string name, std::string def, std::string doc, std::vector<std::string> allowed = {}) {
  KeySpec k;
  k.name = std::move(name);
  k.type = ValueType::kString;
  k.default_value = std::move(def);
  k.doc = std::move(doc);
  k.allowed = std::move(allowed);
  return k;
}
KeySpec path(std::string name, std::string doc, bool required) {
  KeySpec k;
  k.name = std::move(name);
  k.type = ValueType::kString;
  k.doc = std::move(doc);
  k.required = required;
  k.is_path = true;
  if (!required) k.default_value = std::string();
  return k;
}
KeySpec integer(std::string name, int64_t def, std::string doc, std::optional<double> min = {},
                std::optional<double> max = {}) {
  KeySpec k;
  k.name = std::move(name);
  k.type = ValueType::kInteger;
  k.default_value = def;
  k.doc = std::move(doc);
  k.min = min;
  k.max = max;
  return k;
}
KeySpec real(std::string name, double def, std::string doc, std::optional<double> min = {}, std::optional<double> max = {}) {
  KeySpec k;
  k.name = std::move(name);
  k.type = ValueType::kFloat;
  k.default_value = def;
  k.doc = std::move(doc);
  k.min = min;
  k.max = max;
  return k;
}
KeySpec boolean(std::string name, bool def, std::string doc) {
  KeySpec k;
  k.name = std::move(name);
  k.type = ValueType::kBool;
  k.default_value = def;
  k.doc = std::move(doc);
  return k;
}

std::vector<CoreSection> build() {
  std::vector<CoreSection> s;
  s.push_back({"model", "the checkpoint to serve and how to load it",
               {{path("path", "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)", true),
                 str("revision", "", "revision or checksum the recipe was qualified with (informational)"),
                 str("served_name", "", "model id reported by /v1/models (default: the directory name)"),
                 str("dtype", "auto",
                     "the CUDA runner's weight / activation dtype: auto = bf16, the only one it implements (the CPU "
                     "runner's arithmetic is model.precision)",
                     {"auto", "bf16"}),
                 str("load", "mmap", "mmap = read the checkpoint; dummy = random weights of the config's shapes",
                     {"mmap", "dummy"}),
                 str("device", "auto", "where to run: auto = cuda when a GPU is present", {"auto", "cpu", "cuda"}),
                 integer("threads", 0, "CPU threads (0 = all cores)", 0, 4096),
                 str("precision", "fp32",
                     "the CPU runner's arithmetic: fp32, or bf16 = the CUDA runner's rounding (bf16 weights, "
                     "activations rounded where the GPU stores bf16), so CPU and GPU decode alike",
                     {"fp32", "bf16"})}},
               std::nullopt});
  s.push_back({"weights", "weight format plugin", {{str("format", "dense", "weight format (plugin kind weight_format)")}},
               "format", PluginKind::kWeightFormat});
  s.push_back({"kv", "KV-cache layout plugin and paging",
               {{str("layout", "bf16", "KV-cache layout (plugin kind kv_layout)"),
                 integer("block_size", 64, "tokens per KV page", 1, 4096)}},
               "layout", PluginKind::kKvLayout});
  s.push_back({"speculative", "speculative decoding",
               {{str("method", "none", "drafter (plugin kind drafter): none, mtp, dflash2, ..."),
                 integer("depth", 3, "draft tokens proposed per step (K)", 0, 16),
                 integer("max_batch", 0,
                         "draft only in steps where at most this many sequences decode (0 = always); larger "
                         "steps decode without drafts",
                         0, 4096),
                 path("draft_model",
                      "separate draft checkpoint directory: required by drafters that load one, refused by the others",
                      false),
                 str("draft_kv_dtype", "bf16",
                     "dtype of the drafter's own KV caches: fp8 is refused for drafters that keep none (mtp's KV "
                     "follows the target's layout)",
                     {"bf16", "fp8"})}},
               "method", PluginKind::kDrafter});
  s.push_back({"parallel", "parallelism",
               {{integer("tensor", 1,
                         "tensor-parallel ranks: heads, MLP columns, routed experts and vocabulary split over them, "
                         "output bit-identical to 1 (CPU: ranks as threads, or processes with `socket`; CUDA: one rank "
                         "process per GPU, MLA + MoE architectures)",
                         1, 64),
                 integer("decode_context", 1,
                         "decode-context-parallel ranks: groups of this many consecutive tensor ranks split the KV "
                         "cache by token (position p on rank p mod decode_context; the scheduler's blocks are "
                         "kv.block_size × decode_context tokens, one page per rank), attention merged by log-sum-exp "
                         "(logits equal one rank's to fp32 rounding); must divide tensor (CPU ranks; refused on CUDA)",
                         1, 64)}},
               std::nullopt});
  // custom_all_reduce(_force_fail) and env configure NCCL: they are the keys of a collective that provides it (the
  // transport-nccl plugin's schema adds them to [transport]); the built-in `local` has nothing to configure.
  const std::string no_nccl =
      "no collective plugin providing NCCL is loaded (the transport-nccl plugin provides one where kiln was built "
      "with CUDA and NCCL; `kiln plugins` lists what loaded)";
  s.push_back({"transport", "collectives between ranks",
               {{str("backend", "local",
                     "collective (plugin kind collective): local (CPU ranks as threads of one process), socket (CPU "
                     "ranks, one process each, over TCP: kiln serve/generate launch them), nccl (GPUs)")}},
               "backend",
               PluginKind::kCollective,
               {{"custom_all_reduce", "CUDA-IPC custom all-reduce: auto, on, off", no_nccl},
                {"custom_all_reduce_force_fail", "make the custom all-reduce probe fail (tests the fallback)", no_nccl},
                {"env", "environment variables set before NCCL initialises, e.g. NCCL_CUMEM_ENABLE", no_nccl}}});
  s.push_back({"scheduler", "continuous batching and memory",
               {{integer("max_model_len", 0, "longest prompt + output per sequence (0 = the model's limit)", 0),
                 integer("max_output_tokens", 4096, "default and cap for max_tokens", 1),
                 integer("max_num_seqs", 16, "sequences running at once", 1, 4096),
                 integer("max_num_batched_tokens", 2048, "tokens per engine step (bounds prefill chunks)", 1),
                 integer("lone_prompt_tokens", 0,
                         "tokens one step may take of a prompt alone in the engine (nothing else running or waiting; "
                         "with `max_num_seqs` 1, the one running — those waiting cannot start before it ends) instead of max_num_batched_tokens; 0: no exception. On CUDA such a step runs each layer over "
                         "tiles of 8,192 rows, expanding every cached key once a layer, not once a chunk; requests "
                         "arriving meanwhile wait for it",
                         0),
                 integer("max_waiting", 1024, "requests queued beyond the running ones before new ones get 429", 1),
                 boolean("batch_invariant", false,
                         "every step, prompt chunks included, inside the model's batch-invariance bound (on the GPU "
                         "32 rows, prompt chunks of 32 tokens through the decode kernels): output independent of "
                         "batching, chunking and the prefix cache, prefill much slower; needs max_num_seqs within "
                         "the bound"),
                 real("gpu_memory_utilization", 0.9, "share of device memory kiln may use", 0.05, 1.0),
                 boolean("prefix_caching", true, "reuse KV blocks of shared prompt prefixes")}},
               std::nullopt});
  s.push_back({"media", "non-text inputs",
               {{str("modality", "text", "modality plugin: text, image (plugin vision)"),
                 integer("max_images", 16, "images per request", 0, 1024),
                 boolean("remote_urls", false,
                         "fetch http(s) image URLs (off: only data: URLs; on, the server fetches what clients name)"),
                 integer("remote_max_mib", 20, "largest remote image, MiB (with remote_urls)", 1, 1024),
                 integer("remote_timeout_s", 10, "seconds a remote image may take to arrive (with remote_urls)", 1, 300),
                 boolean("video", false, "accept video input: true is refused unless the modality accepts video")}},
               "modality", PluginKind::kModality});
  s.push_back({"server", "the OpenAI-compatible HTTP server",
               {{str("host", "127.0.0.1", "listen address"), integer("port", 8000, "listen port (0 = any free port)", 0, 65535),
                 str("api_key_env", "", "environment variable holding the API key (empty = no auth)"),
                 str("tool_parser", "auto", "tool-call parser (auto: the one for the checkpoint's model_type)",
                     {"auto", "glm47", "deepseek_v3", "none"}),
                 str("reasoning_parser", "auto", "reasoning parser (auto: glm45 for GLM checkpoints, none for DeepSeek-V3)",
                     {"auto", "glm45", "none"}),
                 integer("max_body_bytes", 0,
                         "largest request body; larger ones get 413 (0 = 1 MiB + 16 bytes per token of "
                         "scheduler.max_model_len)",
                         0),
                 integer("max_connections", 512,
                         "connections served at once (at most 900); beyond them a connection gets 503 with Retry-After", 1,
                         900),
                 integer("header_timeout_s", 10, "seconds from a request's first byte to the end of its headers", 1, 3600),
                 integer("read_timeout_s", 60, "seconds a request's body may take to arrive after its headers", 1,
                         3600),
                 integer("drain_timeout_s", 30,
                         "on SIGTERM / SIGINT, seconds to let requests in flight finish before cancelling them "
                         "(0 = cancel at once)",
                         0, 86400),
                 real("keep_alive_interval_s", 5.0,
                      "seconds a stream may stay silent (a long prefill) before an SSE \": keep-alive\" comment; also "
                      "the TCP keep-alive probe interval (whole seconds, at least 1)",
                      0.01, 3600.0)}},
               std::nullopt});
  return s;
}

}  // namespace

const std::vector<CoreSection>& core_sections() {
  static const std::vector<CoreSection> sections = build();
  return sections;
}

const CoreSection* find_core_section(const std::string& name) {
  for (const auto& s : core_sections())
    if (s.name == name) return &s;
  return nullptr;
}

const UnprovidedKey* find_unprovided_key(const CoreSection& section, const std::string& name) {
  for (const auto& k : section.unprovided)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace kiln
