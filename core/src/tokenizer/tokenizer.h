// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json, producing the same ids and text as the
// `tokenizers` library for what GLM-family checkpoints use:
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges, unk_token/fuse_unk; no dropout,
//                  subword prefix/suffix or byte_fallback (refused, naming the field)
//   normalizer     null or NFC (or a Sequence of NFC)
//   pre_tokenizer  null, Split (Regex/String; Removed/Isolated/MergedWithPrevious/MergedWithNext/Contiguous;
//                  invert), ByteLevel (add_prefix_space, use_regex = GPT-2 pattern), Sequence of those
//   added_tokens   special and non-special, matched before pre-tokenisation; lstrip/rstrip/single_word/normalized
//   decoder        ByteLevel (null is accepted for files that omit it; decoding is byte-level either way)
//   post_processor ignored: encode() never adds special tokens (the chat template writes them), i.e. it matches
//                  `tokenizers`' encode(text, add_special_tokens=False)
// Regexes run on Oniguruma, the engine `tokenizers` uses, so Unicode classes split identically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/status.h"

namespace kiln {

// Part of a prompt as a chat template assembles it: the template's own markup, where special tokens are matched,
// or text that came from a client, where they never are. A user who types "<|assistant|>" gets those characters,
// not the role token, and cannot forge a turn or a tool result.
// A media piece (media ≥ 0, no text) marks where the request's media item `media` goes: the server puts the tokens
// the modality gives it there; encode() skips it.
struct PromptPiece {
  std::string text;
  bool client_text = false;
  int32_t media = -1;
};

class Tokenizer {
 public:
  // Malformed files fail with kDataLoss, unsupported components with kUnimplemented; both name the file and
  // the JSON field ("model.merges[12]: token 'x' is not in model.vocab").
  static Result<Tokenizer> load(const std::filesystem::path& tokenizer_json);
  // Same, from the JSON text; `source_name` stands for the file in messages.
  static Result<Tokenizer> from_json_text(std::string_view json_text, const std::string& source_name);

  // With parse_special false, special added tokens in `text` are tokenized as ordinary text (non-special
  // added tokens still match), like `tokenizers`' encode_special_tokens = True. Invalid UTF-8 in `text` is
  // replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // The pieces' concatenation, with special tokens matched only inside markup pieces (a match must lie within
  // one piece). Whenever the client text holds no special token this equals encode(concatenation): pieces are
  // joined again before pre-tokenisation, so BPE sees the same words.
  std::vector<int32_t> encode(std::span<const PromptPiece> pieces) const;

  // Ill-formed UTF-8 produced by the ids (a character split across a cut) becomes U+FFFD, one per maximal
  // subpart, and unknown ids are skipped, as in `tokenizers`.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes one token stands for (may be part of a UTF-8 character); empty for unknown ids.
  std::string token_bytes(int32_t id) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string ("Ġthe", "<|user|>"); empty for unknown ids.
  std::string id_to_token(int32_t id) const;
  // Largest id + 1 over the model vocabulary and the added tokens.
  int64_t vocab_size() const;
  bool is_special(int32_t id) const;
  // The text of every special added token ("<|user|>", "[gMASK]"), as the chat template renderer escapes them.
  std::vector<std::string> special_token_texts() const;

  struct Impl;  // opaque, defined in tokenizer.cpp

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln
