// Malformed and unsupported tokenizer.json files fail with a Status naming the file and the field.
#include "tokenizer_test_support.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

Json base_json() {
  return Json::parse(testing::read_text(testing::tokenizer_data_dir() / "tokenizer.json"));
}

Status load_patched(const Json& patch) {
  Json json = base_json();
  json.merge_patch(patch);
  return Tokenizer::from_json_text(json.dump(), "patched.json").status();
}

void expect_error(const Status& status, StatusCode code, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (const std::string& fragment : fragments) {
    EXPECT_NE(status.message().find(fragment), std::string::npos)
        << "'" << fragment << "' missing from: " << status.message();
  }
}

TEST(TokenizerErrors, MissingFileNamesThePath) {
  const auto result = Tokenizer::load("/nonexistent/dir/tokenizer.json");
  expect_error(result.status(), StatusCode::kNotFound, {"/nonexistent/dir/tokenizer.json"});
}

TEST(TokenizerErrors, BadJsonNamesTheFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "kiln_bad_tokenizer.json";
  std::ofstream(path) << "{\"model\": {\"vocab\": ";
  const auto result = Tokenizer::load(path);
  expect_error(result.status(), StatusCode::kDataLoss, {path.string(), "not valid JSON"});
  std::filesystem::remove(path);
}

TEST(TokenizerErrors, MissingModelOrVocab) {
  Json no_model = base_json();
  no_model.erase("model");
  expect_error(Tokenizer::from_json_text(no_model.dump(), "x.json").status(), StatusCode::kDataLoss,
               {"x.json", "model"});
  expect_error(load_patched({{"model", {{"vocab", nullptr}}}}), StatusCode::kDataLoss, {"patched.json", "model.vocab"});
  expect_error(load_patched({{"model", {{"merges", 7}}}}), StatusCode::kDataLoss, {"model.merges"});
}

TEST(TokenizerErrors, SparseVocabularyIdIsRefusedNotAllocated) {
  // Found by the tokenizer_json fuzzer: one id near 2^31 made a 17 GB dense id table.
  Json json = base_json();
  json["model"]["vocab"]["far"] = 552000000;
  expect_error(Tokenizer::from_json_text(json.dump(), "sparse.json").status(), StatusCode::kDataLoss,
               {"sparse.json", "model.vocab[\"far\"]", "552000000"});
}

TEST(TokenizerErrors, AddedTokenFarPastTheVocabularyIsRefused) {
  Json json = base_json();
  json["added_tokens"][0]["id"] = 2000000000;
  expect_error(Tokenizer::from_json_text(json.dump(), "far.json").status(), StatusCode::kDataLoss,
               {"far.json", "added_tokens[0].id", "2000000000"});
}

TEST(TokenizerErrors, FlagOfTheWrongTypeIsNamed) {
  expect_error(load_patched({{"model", {{"fuse_unk", "yes"}}}}), StatusCode::kDataLoss, {"patched.json", "fuse_unk"});
  EXPECT_TRUE(load_patched({{"model", {{"fuse_unk", nullptr}}}}).ok());
}

// The normalizer reader recurses into nested "Sequence" entries: a file nested 100,000 deep is refused at parse
// time with the limit named, not read until the stack overflows.
TEST(TokenizerErrors, NestingPastTheBoundIsRefused) {
  std::string text = base_json().dump();
  const std::string key = "\"normalizer\":";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  std::string nested;
  const int depth = 100000;
  for (int i = 0; i < depth; ++i) nested += "{\"type\":\"Sequence\",\"normalizers\":[";
  nested += "{\"type\":\"NFC\"}";
  for (int i = 0; i < depth; ++i) nested += "]}";
  // Replace the normalizer's value (whatever it is) by the nested one: parse, patch, re-dump would recurse too.
  Json patched = base_json();
  patched["normalizer"] = nullptr;
  text = patched.dump();
  const size_t null_at = text.find(key + "null");
  ASSERT_NE(null_at, std::string::npos);
  text.replace(null_at + key.size(), 4, nested);
  expect_error(Tokenizer::from_json_text(text, "deep.json").status(), StatusCode::kDataLoss,
               {"deep.json", "nested deeper than"});
}

TEST(TokenizerErrors, MergeNamingAnUnknownToken) {
  Json json = base_json();
  json["model"]["merges"][3] = Json::array({"Ġ", "NOT_A_TOKEN"});
  expect_error(Tokenizer::from_json_text(json.dump(), "m.json").status(), StatusCode::kDataLoss,
               {"m.json", "model.merges[3]", "NOT_A_TOKEN"});
  json["model"]["merges"][3] = "only-one-part";
  expect_error(Tokenizer::from_json_text(json.dump(), "m.json").status(), StatusCode::kDataLoss,
               {"model.merges[3]", "only-one-part"});
}

TEST(TokenizerErrors, UnsupportedComponentsNameTheirField) {
  expect_error(load_patched({{"normalizer", {{"type", "Lowercase"}}}}), StatusCode::kUnimplemented,
               {"normalizer.type", "Lowercase"});
  expect_error(load_patched({{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace"}}}}}}}),
               StatusCode::kUnimplemented, {"pre_tokenizer.pretokenizers[0].type", "Metaspace"});
  expect_error(load_patched({{"decoder", {{"type", "WordPiece"}}}}), StatusCode::kUnimplemented,
               {"decoder.type", "WordPiece"});
  expect_error(load_patched({{"model", {{"dropout", 0.1}}}}), StatusCode::kUnimplemented, {"model.dropout"});
  expect_error(load_patched({{"model", {{"byte_fallback", true}}}}), StatusCode::kUnimplemented,
               {"model.byte_fallback"});
  expect_error(load_patched({{"model", {{"type", "WordPiece"}}}}), StatusCode::kUnimplemented, {"model.type"});
}

TEST(TokenizerErrors, BadRegexAndBehavior) {
  const Json bad_regex = {
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}};
  expect_error(load_patched(bad_regex), StatusCode::kInvalidArgument, {"pre_tokenizer.pattern.Regex", "(unclosed"});
  const Json bad_behavior = {
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}}}};
  expect_error(load_patched(bad_behavior), StatusCode::kDataLoss, {"pre_tokenizer.behavior", "Sideways"});
}

TEST(TokenizerErrors, MalformedAddedToken) {
  expect_error(load_patched({{"added_tokens", {{{"content", "<x>"}}}}}), StatusCode::kDataLoss, {"added_tokens[0].id"});
  expect_error(load_patched({{"added_tokens", {{{"id", 5000}}}}}), StatusCode::kDataLoss, {"added_tokens[0].content"});
}

}  // namespace
}  // namespace kiln
