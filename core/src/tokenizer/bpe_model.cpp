#include "tokenizer/bpe_model.h"

#include <queue>

#include "tokenizer/utf8.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

Status malformed(const std::string& field, const std::string& what) {
  return data_loss(field + ": " + what);
}

// A merge may use "a b" (one space) or ["a", "b"]; tokens of the string form cannot contain a space.
Result<std::pair<std::string, std::string>> merge_pair(const Json& entry, const std::string& field) {
  if (entry.is_string()) {
    const std::string& s = entry.get_ref<const std::string&>();
    const std::size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return malformed(field, "expected two tokens separated by one space, got '" + s + "'");
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return malformed(field, "expected \"a b\" or [\"a\", \"b\"]");
}

Status require_unset(const Json& json, const char* key, const std::string& field) {
  if (!json.contains(key) || json[key].is_null()) return ok_status();
  if (json[key].is_string() && json[key].get_ref<const std::string&>().empty()) return ok_status();
  if (json[key].is_boolean() && !json[key].get<bool>()) return ok_status();
  return unimplemented(field + "." + key + ": " + json[key].dump() + " is not supported (kiln's BPE supports " +
                       "byte-level vocabularies without dropout, subword prefixes/suffixes or byte fallback)");
}

constexpr int64_t kMaxUnusedVocabIds = 1 << 20;

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& json, const std::string& field) {
  if (!json.is_object()) return malformed(field, "missing or not an object");
  if (json.contains("type") && json["type"] != "BPE") {
    return unimplemented(field + ".type: model '" + json["type"].dump() + "' is not supported (only BPE)");
  }
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"}) {
    KILN_RETURN_IF_ERROR(require_unset(json, key, field));
  }
  auto model = std::make_unique<BpeModel>();

  if (!json.contains("vocab") || !json["vocab"].is_object())
    return malformed(field + ".vocab", "missing or not an object");
  // The id -> token table is dense, so an id far beyond the vocabulary's size would allocate a table for ids that
  // name nothing (a hostile file asks for billions of entries). Real vocabularies are dense; allow a generous gap.
  const int64_t id_limit = static_cast<int64_t>(json["vocab"].size()) + kMaxUnusedVocabIds;
  for (const auto& [token, id] : json["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return malformed(field + ".vocab[\"" + token + "\"]", "id must be a non-negative 32-bit integer");
    }
    if (id.get<int64_t>() >= id_limit) {
      return malformed(field + ".vocab[\"" + token + "\"]",
                       "id " + std::to_string(id.get<int64_t>()) + " is beyond the vocabulary's " +
                           std::to_string(json["vocab"].size()) + " entries plus " +
                           std::to_string(kMaxUnusedVocabIds) + " unused ids");
    }
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    model->vocab_.emplace(token, i);
    if (static_cast<std::size_t>(i) >= model->tokens_.size()) model->tokens_.resize(static_cast<std::size_t>(i) + 1);
    model->tokens_[static_cast<std::size_t>(i)] = token;
  }

  if (!json.contains("merges") || !json["merges"].is_array())
    return malformed(field + ".merges", "missing or not an array");
  const Json& merges = json["merges"];
  model->merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string where = field + ".merges[" + std::to_string(rank) + "]";
    KILN_ASSIGN_OR_RETURN(auto pair, merge_pair(merges[rank], where));
    const auto left = model->token_to_id(pair.first);
    const auto right = model->token_to_id(pair.second);
    const auto merged = model->token_to_id(pair.first + pair.second);
    if (!left) return malformed(where, "token '" + pair.first + "' is not in " + field + ".vocab");
    if (!right) return malformed(where, "token '" + pair.second + "' is not in " + field + ".vocab");
    if (!merged)
      return malformed(where, "merged token '" + pair.first + pair.second + "' is not in " + field + ".vocab");
    // A repeated pair keeps its last rank, as Hugging Face's map construction does.
    model->merges_[pair_key(*left, *right)] = Merge{static_cast<int32_t>(rank), *merged};
  }

  if (json.contains("unk_token") && json["unk_token"].is_string()) {
    model->unk_id_ = model->token_to_id(json["unk_token"].get<std::string>());
    if (!model->unk_id_) return malformed(field + ".unk_token", "token is not in " + field + ".vocab");
  }
  if (json.contains("fuse_unk") && !json["fuse_unk"].is_boolean() && !json["fuse_unk"].is_null())
    return malformed(field + ".fuse_unk", "must be a boolean");
  model->fuse_unk_ = json.contains("fuse_unk") && json["fuse_unk"].is_boolean() && json["fuse_unk"].get<bool>();
  model->ignore_merges_ =
      json.contains("ignore_merges") && json["ignore_merges"].is_boolean() && json["ignore_merges"].get<bool>();
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string kNone;
  if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size()) return kNone;
  return tokens_[static_cast<std::size_t>(id)];
}

void BpeModel::tokenize(const std::string& piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto whole = token_to_id(piece)) {
      ids.push_back(*whole);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  merge_word(piece, word_ids);
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, std::move(word_ids));
  }
}

// Symbols form a doubly linked list; a min-heap of candidate merges ordered by (rank, position) applies the
// lowest-ranked, leftmost merge first. Stale heap entries are recognised by re-checking the pair.
void BpeModel::merge_word(const std::string& piece, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (std::size_t pos = 0; pos < piece.size();) {
    std::size_t length = 1;
    utf8::decode_at(piece, pos, length);
    const auto id = token_to_id(std::string_view(piece).substr(pos, length));
    pos += length;
    if (id) {
      symbols.push_back({*id, 0, 0, true});
    } else if (unk_id_) {
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_id_) continue;
      symbols.push_back({*unk_id_, 0, 0, true});
    }
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    int32_t rank;
    int position;
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : position > o.position; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[symbols[left].next].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.position];
    if (!left.alive || left.next < 0) continue;
    const auto it = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    consider(left.prev);
    consider(top.position);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids.push_back(s.id);
  }
}

}  // namespace kiln
