// The BPE model of a tokenizer.json: vocabulary, ranked merges, and the merge loop that turns one
// pre-tokenized piece into ids. Results are cached per piece, since text repeats its words.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/status.h"

namespace kiln {

class BpeModel {
 public:
  // `json` is the "model" object; errors name fields under `field` ("model").
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& json, const std::string& field);

  // Appends the ids of one piece (already mapped to the byte alphabet when the tokenizer is byte-level).
  void tokenize(const std::string& piece, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Empty when no vocabulary entry has this id.
  const std::string& id_to_token(int32_t id) const;
  int64_t max_id() const { return static_cast<int64_t>(tokens_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(const std::string& piece, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id; empty for ids the vocabulary skips
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  static constexpr std::size_t kMaxCacheEntries = 1 << 16;
  static constexpr std::size_t kMaxCachedPieceBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kiln
