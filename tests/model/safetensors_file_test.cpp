#include "model/safetensors_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/safetensors_writer.h"

namespace kiln {
namespace {

using testing::build_safetensors;
using testing::frame;
using ::testing::HasSubstr;
using testing::raw_bytes;
using testing::ScratchDir;
using testing::TensorSpec;
using testing::write_file;

class SafetensorsFileTest : public ::testing::Test {
 protected:
  // Writes `bytes` as <dir>/<name> and opens it.
  Result<SafetensorsFile> open_bytes(const std::string& bytes, const std::string& name = "weights.safetensors") {
    write_file(dir_ / name, bytes);
    return SafetensorsFile::open(dir_ / name);
  }
  // An error whose message names the file; returns the message for further checks.
  std::string expect_error(const std::string& bytes, StatusCode code) {
    Result<SafetensorsFile> r = open_bytes(bytes);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_THAT(r.status().message(), HasSubstr("weights.safetensors"));
    return r.status().message();
  }

  ScratchDir dir_;
};

TEST_F(SafetensorsFileTest, ReadsEveryDtypeWithShapesAndData) {
  const std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};  // 1..6
  const std::vector<float> f32 = {0.5f, -1.5f, 2.25f, 8.0f};
  const std::vector<int8_t> i8 = {-3, 0, 7};
  const std::vector<uint8_t> f8 = {0x38, 0x40, 0xb8, 0x00};
  const std::vector<int16_t> i16 = {-300, 300};
  const std::vector<int32_t> i32 = {123456};
  const std::vector<int64_t> i64 = {-9000000000LL, 1};
  const std::vector<uint8_t> u8 = {255, 1};
  const std::vector<uint16_t> f16 = {0x3c00};
  const std::string bytes = build_safetensors({{"model.embed.weight", "BF16", {2, 3}, raw_bytes(bf16)},
                                               {"model.norm.weight", "F32", {2, 2}, raw_bytes(f32)},
                                               {"q.i8", "I8", {3}, raw_bytes(i8)},
                                               {"q.f8", "F8_E4M3", {1, 2, 2}, raw_bytes(f8)},
                                               {"q.i16", "I16", {2}, raw_bytes(i16)},
                                               {"q.i32", "I32", {}, raw_bytes(i32)},
                                               {"q.i64", "I64", {2}, raw_bytes(i64)},
                                               {"q.u8", "U8", {2, 1}, raw_bytes(u8)},
                                               {"q.f16", "F16", {1}, raw_bytes(f16)},
                                               {"empty", "F32", {0, 4}, ""}},
                                              {{"format", "pt"}});
  Result<SafetensorsFile> file = open_bytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();

  EXPECT_EQ(file->size(), 10u);
  EXPECT_EQ(file->names().front(), "empty");
  EXPECT_EQ(file->names().back(), "q.u8");
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_TRUE(file->has("q.i8"));
  EXPECT_FALSE(file->has("q.i9"));

  Result<TensorView> emb = file->get("model.embed.weight");
  ASSERT_TRUE(emb.ok());
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(emb->rank, 2);
  EXPECT_EQ(emb->shape_string(), "[2, 3]");
  EXPECT_EQ(emb->strides[0], 3);
  EXPECT_EQ(emb->strides[1], 1);
  EXPECT_TRUE(emb->device.is_cpu());
  EXPECT_EQ(emb->as<uint16_t>()[5], 0x40c0);

  Result<TensorView> norm = file->get("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_FLOAT_EQ(norm->as<float>()[2], 2.25f);

  EXPECT_EQ(file->get("q.i8")->as<int8_t>()[0], -3);
  EXPECT_EQ(file->get("q.f8")->dtype, DType::kF8E4M3);
  EXPECT_EQ(file->get("q.f8")->shape_string(), "[1, 2, 2]");
  EXPECT_EQ(file->get("q.i16")->as<int16_t>()[0], -300);
  EXPECT_EQ(file->get("q.i32")->rank, 0);
  EXPECT_EQ(file->get("q.i32")->numel(), 1);
  EXPECT_EQ(file->get("q.i32")->as<int32_t>()[0], 123456);
  EXPECT_EQ(file->get("q.i64")->as<int64_t>()[0], -9000000000LL);
  EXPECT_EQ(file->get("q.u8")->as<uint8_t>()[0], 255);
  EXPECT_EQ(file->get("q.f16")->dtype, DType::kF16);
  EXPECT_EQ(file->get("empty")->numel(), 0);
  EXPECT_TRUE(file->get("model.norm.weight")->is_contiguous());
  // The writer packs tensors in name order, unaligned: every view is aligned to its element size anyway (the
  // misaligned ones come from aligned copies), so typed reads are defined (UBSan checks this in the sanitized pass).
  EXPECT_GE(file->misaligned_count(), 1u);
  for (const std::string& name : file->names()) {
    const TensorView view = *file->get(name);
    if (view.numel() == 0) continue;  // nothing to read
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype), 0u) << name;
  }
}

TEST_F(SafetensorsFileTest, MisalignedTensorsReadFromAlignedCopiesWithTheFilesBytes) {
  // One byte of U8 first puts the I32 and I64 after it at odd offsets (the header is padded to 8 bytes).
  const std::vector<uint8_t> pad = {7};
  const std::vector<int32_t> i32 = {-5, 70000, 3};
  const std::vector<int64_t> i64 = {1LL << 40, -2};
  const std::string bytes = build_safetensors({{"a.pad", "U8", {1}, raw_bytes(pad)},
                                               {"b.i32", "I32", {3}, raw_bytes(i32)},
                                               {"c.i64", "I64", {2}, raw_bytes(i64)}});
  Result<SafetensorsFile> file = open_bytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->misaligned_count(), 2u);
  const TensorView a = *file->get("b.i32");
  const TensorView b = *file->get("b.i32");
  EXPECT_EQ(a.data, b.data);  // copied once
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 4, 0u);
  EXPECT_EQ(std::vector<int32_t>(a.as<int32_t>(), a.as<int32_t>() + 3), i32);
  const TensorView c = *file->get("c.i64");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data) % 8, 0u);
  EXPECT_EQ(c.as<int64_t>()[0], 1LL << 40);
  EXPECT_EQ(c.as<int64_t>()[1], -2);
  // Moving the file keeps the copies where they are.
  SafetensorsFile moved = std::move(file).value();
  EXPECT_EQ(moved.get("b.i32")->data, a.data);
}

TEST_F(SafetensorsFileTest, MovedFileKeepsServingTheMapping) {
  const std::vector<float> v = {1.f, 2.f};
  Result<SafetensorsFile> opened = open_bytes(build_safetensors({{"w", "F32", {2}, raw_bytes(v)}}));
  ASSERT_TRUE(opened.ok());
  SafetensorsFile moved = std::move(opened).value();
  SafetensorsFile assigned = std::move(moved);
  EXPECT_FLOAT_EQ(assigned.get("w")->as<float>()[1], 2.f);
  EXPECT_THAT(assigned.path().string(), HasSubstr("weights.safetensors"));
}

TEST_F(SafetensorsFileTest, MissingTensorNamesTensorAndFile) {
  Result<SafetensorsFile> file = open_bytes(build_safetensors({{"w", "U8", {1}, "x"}}));
  ASSERT_TRUE(file.ok());
  Result<TensorView> r = file->get("model.missing.weight");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("model.missing.weight"));
  EXPECT_THAT(r.status().message(), HasSubstr("weights.safetensors"));
}

TEST_F(SafetensorsFileTest, MissingFileIsNotFound) {
  Result<SafetensorsFile> r = SafetensorsFile::open(dir_ / "absent.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("absent.safetensors"));
}

TEST_F(SafetensorsFileTest, RejectsFileShorterThanHeaderLength) {
  EXPECT_THAT(expect_error("abc", StatusCode::kDataLoss), HasSubstr("too short"));
}

TEST_F(SafetensorsFileTest, RejectsHeaderLengthBeyondFile) {
  std::string bytes = frame("{}", "");
  bytes[0] = static_cast<char>(0xe8);  // claims 1000 header bytes; the file has 2
  bytes[1] = 0x03;
  EXPECT_THAT(expect_error(bytes, StatusCode::kDataLoss), HasSubstr("header length 1000 runs past the end"));
}

TEST_F(SafetensorsFileTest, RejectsHeaderLengthAboveCap) {
  std::string bytes = frame("{}", "");
  bytes[4] = 0x01;  // 2^32 + 2 bytes
  EXPECT_THAT(expect_error(bytes, StatusCode::kDataLoss), HasSubstr("limit"));
}

TEST_F(SafetensorsFileTest, RejectsNonJsonHeader) {
  EXPECT_THAT(expect_error(frame("this is not json", ""), StatusCode::kDataLoss), HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsFileTest, RejectsHeaderThatIsNotAnObject) {
  EXPECT_THAT(expect_error(frame("[1, 2]", ""), StatusCode::kDataLoss), HasSubstr("must be a JSON object"));
}

TEST_F(SafetensorsFileTest, RejectsDuplicateTensorNames) {
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_THAT(expect_error(frame(header, "xy"), StatusCode::kDataLoss), HasSubstr("tensor 'a' appears twice"));
}

TEST_F(SafetensorsFileTest, RejectsTruncatedData) {
  const std::vector<float> a(4, 1.f);
  const std::vector<float> b(8, 2.f);
  std::string bytes =
      build_safetensors({{"layers.0.a", "F32", {4}, raw_bytes(a)}, {"layers.0.b", "F32", {8}, raw_bytes(b)}});
  bytes.resize(bytes.size() - 5);
  const std::string msg = expect_error(bytes, StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("tensor 'layers.0.b'"));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST_F(SafetensorsFileTest, RejectsOffsetsPastDataRegion) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[10,14]}})";
  const std::string msg = expect_error(frame(header, "abcd"), StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("[10, 14) extend past the data region (4 bytes)"));
}

TEST_F(SafetensorsFileTest, RejectsOffsetsEndingBeforeTheyBegin) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})";
  const std::string msg = expect_error(frame(header, "abcd"), StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("end before they begin"));
}

TEST_F(SafetensorsFileTest, RejectsOverlappingTensors) {
  const std::string header = R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  const std::string msg = expect_error(frame(header, std::string(12, '\0')), StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("'second'"));
  EXPECT_THAT(msg, HasSubstr("overlaps tensor 'first'"));
}

TEST_F(SafetensorsFileTest, RejectsSizeThatDisagreesWithShape) {
  const std::string header = R"({"mlp.w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})";
  const std::string msg = expect_error(frame(header, std::string(12, '\0')), StatusCode::kDataLoss);
  EXPECT_THAT(msg, HasSubstr("tensor 'mlp.w'"));
  EXPECT_THAT(msg, HasSubstr("hold 8 bytes but shape [2,3] of BF16 needs 12"));
}

TEST_F(SafetensorsFileTest, RejectsUnknownDtype) {
  const std::string header = R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  const std::string msg = expect_error(frame(header, std::string(8, '\0')), StatusCode::kUnimplemented);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("dtype 'F64' is not supported"));
}

TEST_F(SafetensorsFileTest, RejectsEntriesWithMissingOrMalformedFields) {
  EXPECT_THAT(expect_error(frame(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "x"), StatusCode::kDataLoss),
              HasSubstr("tensor 'w': missing string 'dtype'"));
  EXPECT_THAT(
      expect_error(frame(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x"), StatusCode::kDataLoss),
      HasSubstr("tensor 'w': shape entries must be non-negative integers"));
  EXPECT_THAT(expect_error(frame(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x"), StatusCode::kDataLoss),
              HasSubstr("tensor 'w': 'data_offsets' must be two non-negative integers"));
  EXPECT_THAT(expect_error(frame(R"({"__metadata__":{"format":1}})", ""), StatusCode::kDataLoss),
              HasSubstr("__metadata__ entry 'format' must be a string"));
}

}  // namespace
}  // namespace kiln
