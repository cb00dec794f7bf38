#include "model/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/safetensors_writer.h"

namespace kiln {
namespace {

using testing::build_safetensors;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::raw_bytes;
using testing::ScratchDir;
using testing::TensorSpec;
using testing::write_file;

TensorSpec f32_tensor(const std::string& name, std::vector<int64_t> shape, float fill) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, "F32", std::move(shape), raw_bytes(std::vector<float>(static_cast<size_t>(n), fill))};
}

class CheckpointTest : public ::testing::Test {
 protected:
  void write_index(const nlohmann::json& weight_map) {
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    write_file(dir_ / Checkpoint::kIndexFileName, index.dump(2));
  }
  // Two shards: embed + layer 0 in the first, layer 1 + head in the second.
  void write_two_shards() {
    write_file(dir_ / "model-00001-of-00002.safetensors",
               build_safetensors({f32_tensor("model.embed_tokens.weight", {4, 2}, 1.f),
                                  f32_tensor("model.layers.0.w", {2, 2}, 2.f)}));
    write_file(
        dir_ / "model-00002-of-00002.safetensors",
        build_safetensors({f32_tensor("model.layers.1.w", {2, 2}, 3.f), f32_tensor("lm_head.weight", {4, 2}, 4.f)}));
  }
  nlohmann::json two_shard_map() const {
    return {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
            {"model.layers.0.w", "model-00001-of-00002.safetensors"},
            {"model.layers.1.w", "model-00002-of-00002.safetensors"},
            {"lm_head.weight", "model-00002-of-00002.safetensors"}};
  }
  std::string open_error(StatusCode code) {
    Result<std::unique_ptr<Checkpoint>> r = Checkpoint::open(dir_.path());
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    return r.status().message();
  }

  ScratchDir dir_;
};

TEST_F(CheckpointTest, OpensSingleFile) {
  write_file(dir_ / "model.safetensors",
             build_safetensors({f32_tensor("b.weight", {3}, 7.f), f32_tensor("a.weight", {1, 2}, 5.f)}));
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const Checkpoint& c = **ckpt;
  EXPECT_THAT(c.names(), ElementsAre("a.weight", "b.weight"));
  EXPECT_TRUE(c.has("a.weight"));
  EXPECT_FALSE(c.has("c.weight"));
  EXPECT_FLOAT_EQ(c.get("b.weight")->as<float>()[2], 7.f);
  ASSERT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.files()[0].filename(), "model.safetensors");
  // Usable through the SDK interface the weight formats see.
  const WeightSource& source = c;
  EXPECT_EQ(source.get("a.weight")->shape_string(), "[1, 2]");
}

TEST_F(CheckpointTest, OpensShardedCheckpoint) {
  write_two_shards();
  write_index(two_shard_map());
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.names().size(), 4u);
  EXPECT_FLOAT_EQ(c.get("model.embed_tokens.weight")->as<float>()[0], 1.f);
  EXPECT_FLOAT_EQ(c.get("model.layers.1.w")->as<float>()[3], 3.f);
  EXPECT_FLOAT_EQ(c.get("lm_head.weight")->as<float>()[7], 4.f);
  EXPECT_EQ(c.files().size(), 2u);
}

TEST_F(CheckpointTest, SingleFileWinsOverIndexLikeTransformers) {
  write_file(dir_ / "model.safetensors", build_safetensors({f32_tensor("only.weight", {1}, 1.f)}));
  write_index({{"other.weight", "missing.safetensors"}});
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_TRUE((*ckpt)->has("only.weight"));
}

TEST_F(CheckpointTest, RejectsDirectoryWithoutWeights) {
  const std::string msg = open_error(StatusCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr(dir_.path().string()));
  EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
}

TEST_F(CheckpointTest, RejectsMissingShard) {
  write_two_shards();
  nlohmann::json map = two_shard_map();
  map["extra.weight"] = "model-00003-of-00003.safetensors";
  write_index(map);
  const std::string msg = open_error(StatusCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr("model-00003-of-00003.safetensors"));
  EXPECT_THAT(msg, HasSubstr("does not exist"));
}

TEST_F(CheckpointTest, RejectsTensorMappedToShardThatLacksIt) {
  write_two_shards();
  nlohmann::json map = two_shard_map();
  map["model.layers.0.w"] = "model-00002-of-00002.safetensors";  // it is stored in shard 1
  write_index(map);
  const std::string msg = open_error(StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("'model.layers.0.w'"));
  EXPECT_THAT(msg, HasSubstr("model-00002-of-00002.safetensors, but that shard does not contain it"));
}

TEST_F(CheckpointTest, RejectsTensorStoredInTwoShards) {
  write_file(dir_ / "a.safetensors", build_safetensors({f32_tensor("dup.weight", {2}, 1.f)}));
  write_file(dir_ / "b.safetensors",
             build_safetensors({f32_tensor("dup.weight", {2}, 2.f), f32_tensor("other.weight", {2}, 3.f)}));
  write_index({{"dup.weight", "a.safetensors"}, {"other.weight", "b.safetensors"}});
  const std::string msg = open_error(StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("'dup.weight' is stored in shard b.safetensors but the index maps it to a.safetensors"));
}

TEST_F(CheckpointTest, RejectsStoredTensorMissingFromIndex) {
  write_two_shards();
  nlohmann::json map = two_shard_map();
  map.erase("lm_head.weight");
  write_index(map);
  const std::string msg = open_error(StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("contains tensor 'lm_head.weight', which the index does not list"));
}

TEST_F(CheckpointTest, RejectsShardOutsideModelDirectory) {
  write_index({{"w", "../elsewhere.safetensors"}});
  EXPECT_THAT(open_error(StatusCode::kDataLoss), HasSubstr("not a file name in the model directory"));
}

TEST_F(CheckpointTest, RejectsMalformedIndex) {
  write_file(dir_ / Checkpoint::kIndexFileName, "{ nope");
  EXPECT_THAT(open_error(StatusCode::kDataLoss), HasSubstr("model.safetensors.index.json: not valid JSON"));
  write_file(dir_ / Checkpoint::kIndexFileName, R"({"metadata": {}})");
  EXPECT_THAT(open_error(StatusCode::kDataLoss), HasSubstr("missing \"weight_map\""));
}

TEST_F(CheckpointTest, ShardErrorsNameTheShardFile) {
  write_two_shards();
  write_file(dir_ / "model-00002-of-00002.safetensors", "garbage!!garbage");
  write_index(two_shard_map());
  EXPECT_THAT(open_error(StatusCode::kDataLoss), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointTest, GetCheckedReportsBothShapesAndTheFile) {
  write_two_shards();
  write_index(two_shard_map());
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok());
  EXPECT_TRUE((*ckpt)->get_checked("lm_head.weight", {4, 2}).ok());

  Result<TensorView> wrong = (*ckpt)->get_checked("lm_head.weight", {2, 4});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("has shape [4, 2], expected [2, 4]"));

  Result<TensorView> wrong_rank = (*ckpt)->get_checked("lm_head.weight", {8});
  ASSERT_FALSE(wrong_rank.ok());
  EXPECT_THAT(wrong_rank.status().message(), HasSubstr("expected [8]"));
}

TEST_F(CheckpointTest, MissingTensorNamesTensorAndDirectory) {
  write_file(dir_ / "model.safetensors", build_safetensors({f32_tensor("a", {1}, 0.f)}));
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok());
  for (const Result<TensorView>& r :
       {(*ckpt)->get("model.layers.9.w"), (*ckpt)->get_checked("model.layers.9.w", {1})}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_THAT(r.status().message(), HasSubstr("'model.layers.9.w'"));
    EXPECT_THAT(r.status().message(), HasSubstr(dir_.path().string()));
  }
}

}  // namespace
}  // namespace kiln
