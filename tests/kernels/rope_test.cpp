#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

struct HfCosSin {
  int64_t position;
  int index;
  float cos, sin;
};
struct HfRopeReference {
  double attention_scaling;
  double softmax_scale;
  std::vector<float> inv_freq;
  std::vector<HfCosSin> cos_sin;
};

// Generated with transformers 5.17.0 / torch 2.15 (CPU, fp32): DeepseekV3RotaryEmbedding(config).inv_freq,
// its attention_scaling, forward(x_fp32, positions) -> cos/sin (columns < 32: the distinct half), and
// DeepseekV3Attention.scaling (qk_head_dim 96).
// kDeepseekV3Yarn: rope_parameters = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 40.0, 'original_max_position_embeddings': 4096, 'beta_fast': 32, 'beta_slow': 1, 'mscale': 1.0, 'mscale_all_dim': 1.0}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kDeepseekV3Yarn = {
    1.0,  // attention_scaling
    0.19124944415602058,  // DeepseekV3Attention.scaling
    {0x1.000000p+0f, 0x1.7ff222p-1f, 0x1.1feb34p-1f, 0x1.afd136p-2f, 0x1.43d136p-2f, 0x1.e5a846p-3f, 0x1.6c310ep-3f, 0x1.111aeep-3f, 0x1.99999ap-4f, 0x1.33281ap-4f, 0x1.ccab84p-5f, 0x1.3f8b74p-5f, 0x1.b86436p-6f, 0x1.2d1b86p-6f, 0x1.97e506p-7f, 0x1.111aeep-7f, 0x1.6872b2p-8f, 0x1.d2e0ccp-9f, 0x1.26d42cp-9f, 0x1.67459ap-10f, 0x1.9e7c6ep-11f, 0x1.b32624p-12f, 0x1.74eea6p-13f, 0x1.17a8e2p-15f, 0x1.a36e2ep-16f, 0x1.3a8746p-16f, 0x1.d7b9e0p-17f, 0x1.61bea2p-17f, 0x1.094566p-17f, 0x1.8dd9bap-18f, 0x1.2a5884p-18f, 0x1.bf749ep-19f},
    {{1, 0, 0x1.14a282p-1f, 0x1.aed548p-1f},
     {1, 1, 0x1.76a960p-1f, 0x1.5cf59cp-1f},
     {1, 7, 0x1.fb7450p-1f, 0x1.104be6p-3f},
     {1, 15, 0x1.fffb72p-1f, 0x1.111a1ep-7f},
     {1, 16, 0x1.fffe04p-1f, 0x1.68723ap-8f},
     {1, 20, 0x1.fffff6p-1f, 0x1.9e7c6cp-11f},
     {1, 31, 0x1.000000p+0f, 0x1.bf749ep-19f},
     {4095, 0, -0x1.0e3cd8p-4f, -0x1.fee26cp-1f},
     {4095, 1, -0x1.70d474p-4f, -0x1.fdeb88p-1f},
     {4095, 7, 0x1.b1c4c8p-1f, -0x1.10023ap-1f},
     {4095, 15, -0x1.d1e10ap-1f, 0x1.a8bd0cp-2f},
     {4095, 16, -0x1.b96822p-1f, -0x1.036e26p-1f},
     {4095, 20, -0x1.fda722p-1f, -0x1.87c090p-4f},
     {4095, 31, 0x1.fff3cap-1f, 0x1.bf5518p-7f},
     {100000, 0, -0x1.ffac38p-1f, 0x1.24daaap-5f},
     {100000, 1, 0x1.d89eccp-1f, -0x1.89d296p-2f},
     {100000, 7, -0x1.537560p-1f, 0x1.7f4a7ap-1f},
     {100000, 15, -0x1.328d80p-1f, -0x1.9a15acp-1f},
     {100000, 16, -0x1.f38232p-1f, -0x1.c1a016p-3f},
     {100000, 20, -0x1.bd0dc6p-1f, -0x1.fa3ed8p-2f},
     {100000, 31, 0x1.e3cf62p-1f, 0x1.4f17c6p-2f},
     {163839, 0, 0x1.d4589ep-3f, -0x1.f26eaap-1f},
     {163839, 1, 0x1.bf3404p-1f, 0x1.f29c82p-2f},
     {163839, 7, -0x1.337c84p-4f, 0x1.fe8e26p-1f},
     {163839, 15, -0x1.e6f232p-2f, 0x1.c267bep-1f},
     {163839, 16, -0x1.bbadc0p-1f, 0x1.ff0cf8p-2f},
     {163839, 20, -0x1.80a6bap-1f, -0x1.51ea8ep-1f},
     {163839, 31, 0x1.b58126p-1f, 0x1.09f556p-1f}}};
// kMscaleNoTruncate: rope_parameters = {'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 8.0, 'original_max_position_embeddings': 2048, 'beta_fast': 16, 'beta_slow': 2, 'mscale': 0.707, 'mscale_all_dim': 0.5, 'truncate': False}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kMscaleNoTruncate = {
    1.0389905150739585,  // attention_scaling
    0.12438859466261336,  // DeepseekV3Attention.scaling
    {0x1.000000p+0f, 0x1.7ff222p-1f, 0x1.1feb34p-1f, 0x1.afd136p-2f, 0x1.43d136p-2f, 0x1.e5a846p-3f, 0x1.6c310ep-3f, 0x1.111aeep-3f, 0x1.99999ap-4f, 0x1.33281ap-4f, 0x1.ccab84p-5f, 0x1.435f80p-5f, 0x1.a63e00p-6f, 0x1.0d94f2p-6f, 0x1.4dbe32p-7f, 0x1.8ab31ep-8f, 0x1.b138dap-9f, 0x1.9ba8c4p-10f, 0x1.708938p-11f, 0x1.145ceep-11f, 0x1.9e7c70p-12f, 0x1.36d21ap-12f, 0x1.d22a50p-13f, 0x1.5d931cp-13f, 0x1.0624dep-13f, 0x1.892918p-14f, 0x1.26d42cp-14f, 0x1.ba2e4ap-15f, 0x1.4b96c0p-15f, 0x1.f1502ap-16f, 0x1.74eea6p-16f, 0x1.17a8e4p-16f},
    {{3, 0, -0x1.0751dcp+0f, 0x1.2c4856p-3f},
     {3, 1, -0x1.4e08acp-1f, 0x1.9e0326p-1f},
     {3, 7, 0x1.e9f576p-1f, 0x1.9e5e22p-2f},
     {3, 15, 0x1.09f02cp+0f, 0x1.338cd8p-6f},
     {3, 16, 0x1.09f7eep+0f, 0x1.519468p-7f},
     {3, 20, 0x1.09fb3cp+0f, 0x1.42fc3ap-10f},
     {3, 31, 0x1.09fb48p+0f, 0x1.b3d880p-15f},
     {5000, 0, 0x1.491c90p-3f, -0x1.06c7e6p+0f},
     {5000, 1, -0x1.527914p-6f, -0x1.09edd2p+0f},
     {5000, 7, 0x1.87b96ep-1f, 0x1.67e988p-1f},
     {5000, 15, 0x1.19cc54p-2f, -0x1.007b6ap+0f},
     {5000, 16, -0x1.6ba2d8p-1f, -0x1.84451cp-1f},
     {5000, 20, -0x1.a3d1fcp-2f, 0x1.e8cc0ap-1f},
     {5000, 31, 0x1.090eecp+0f, 0x1.62481ap-4f}}};
// kDefaultTheta1e6: rope_parameters = {'rope_type': 'default', 'rope_theta': 1000000.0}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kDefaultTheta1e6 = {
    1.0,  // attention_scaling
    0.10206207261596575,  // DeepseekV3Attention.scaling
    {0x1.000000p+0f, 0x1.4c7bc0p-1f, 0x1.afd136p-2f, 0x1.186a08p-2f, 0x1.6c310ep-3f, 0x1.d8ffacp-4f, 0x1.33281ap-4f, 0x1.8eec7ep-5f, 0x1.030dc6p-5f, 0x1.507316p-6f, 0x1.b4f7e4p-7f, 0x1.1bc25ap-7f, 0x1.708938p-8f, 0x1.dea41cp-9f, 0x1.36d21ap-9f, 0x1.93aeb8p-10f, 0x1.0624dep-10f, 0x1.547688p-11f, 0x1.ba2e4ap-12f, 0x1.1f24e4p-12f, 0x1.74eea6p-13f, 0x1.e459c4p-14f, 0x1.3a8748p-14f, 0x1.987f7cp-15f, 0x1.094564p-15f, 0x1.58863ap-16f, 0x1.bf749ep-17f, 0x1.2291c6p-17f, 0x1.796182p-18f, 0x1.ea20e0p-19f, 0x1.3e47c8p-19f, 0x1.9d5ef2p-20f},
    {{77, 0, -0x1.fb7eb4p-6f, 0x1.ffc11cp-1f},
     {77, 1, 0x1.ee61cap-1f, -0x1.0a4fbap-2f},
     {77, 7, -0x1.a43a92p-1f, -0x1.247e0ap-1f},
     {77, 15, 0x1.fc67a6p-1f, 0x1.e48b10p-4f},
     {77, 16, 0x1.fe7ba0p-1f, 0x1.3b149ap-4f},
     {77, 20, 0x1.fff3b6p-1f, 0x1.c0ab8ap-7f},
     {77, 31, 0x1.000000p+0f, 0x1.f1563cp-14f},
     {202751, 0, 0x1.ca60dcp-2f, -0x1.c9d6b8p-1f},
     {202751, 1, 0x1.9ec4c4p-3f, -0x1.f563d8p-1f},
     {202751, 7, -0x1.843008p-1f, 0x1.4dd90ap-1f},
     {202751, 15, -0x1.6f419ap-2f, -0x1.ddf020p-1f},
     {202751, 16, -0x1.e3598cp-4f, 0x1.fc6c32p-1f},
     {202751, 20, -0x1.2cdf24p-4f, -0x1.fe9deap-1f},
     {202751, 31, 0x1.e73f20p-1f, 0x1.3a8bbap-2f}}};

// kLinearFactor4: rope_parameters = {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 4.0}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kLinearFactor4 = {
    1.0,  // attention_scaling
    0.10206207261596575,  // DeepseekV3Attention.scaling
    {0x1.000000p-2f, 0x1.7ff222p-3f, 0x1.1feb34p-3f, 0x1.afd136p-4f, 0x1.43d136p-4f, 0x1.e5a846p-5f, 0x1.6c310ep-5f, 0x1.111aeep-5f, 0x1.99999ap-6f, 0x1.33281ap-6f, 0x1.ccab84p-7f, 0x1.59742ap-7f, 0x1.030dc6p-7f, 0x1.84869ep-8f, 0x1.235a72p-8f, 0x1.b4f7e4p-9f, 0x1.47ae14p-9f, 0x1.eb7360p-10f, 0x1.708938p-10f, 0x1.145ceep-10f, 0x1.9e7c70p-11f, 0x1.36d21ap-11f, 0x1.d22a50p-12f, 0x1.5d931cp-12f, 0x1.0624dep-12f, 0x1.892918p-13f, 0x1.26d42cp-13f, 0x1.ba2e4ap-14f, 0x1.4b96c0p-14f, 0x1.f1502ap-15f, 0x1.74eea6p-15f, 0x1.17a8e4p-15f},
    {{1, 0, 0x1.f0154ap-1f, 0x1.faaeeep-3f},
     {1, 1, 0x1.f70764p-1f, 0x1.7db364p-3f},
     {1, 7, 0x1.ffb72cp-1f, 0x1.110dfap-5f},
     {1, 15, 0x1.ffff46p-1f, 0x1.b4f7aep-9f},
     {1, 16, 0x1.ffff98p-1f, 0x1.47adfep-9f},
     {1, 20, 0x1.fffff6p-1f, 0x1.9e7c6ep-11f},
     {1, 31, 0x1.000000p+0f, 0x1.17a8e4p-15f},
     {5000, 0, 0x1.e04654p-1f, -0x1.62da6ep-2f},
     {5000, 1, 0x1.8c90e4p-2f, 0x1.d80be4p-1f},
     {5000, 7, -0x1.f730b2p-1f, -0x1.7a4846p-3f},
     {5000, 15, -0x1.253324p-1f, -0x1.a3bc4ap-1f},
     {5000, 16, 0x1.fedf6ap-1f, -0x1.0fa78cp-4f},
     {5000, 20, -0x1.608ec4p-1f, -0x1.734714p-1f},
     {5000, 31, 0x1.f8e742p-1f, 0x1.53cd82p-3f}}};
// kLlama3: rope_parameters = {'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': 8192}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kLlama3 = {
    1.0,  // attention_scaling
    0.10206207261596575,  // DeepseekV3Attention.scaling
    {0x1.000000p+0f, 0x1.53c38cp-1f, 0x1.c2ef78p-2f, 0x1.2b3dc6p-2f, 0x1.8d2760p-3f, 0x1.078d40p-3f, 0x1.5dc95ap-4f, 0x1.d03ccep-5f, 0x1.341190p-5f, 0x1.98de92p-6f, 0x1.0f5386p-6f, 0x1.681adap-7f, 0x1.ddee9ep-8f, 0x1.3d2804p-8f, 0x1.a4ee40p-9f, 0x1.67a23ap-10f, 0x1.132ba4p-11f, 0x1.765ba4p-13f, 0x1.46831ap-14f, 0x1.b15902p-15f, 0x1.1f91f0p-15f, 0x1.7da9e8p-16f, 0x1.fa8b86p-17f, 0x1.5024d6p-17f, 0x1.be2188p-18f, 0x1.280d96p-18f, 0x1.88ec20p-19f, 0x1.04be68p-19f, 0x1.5a0f4ep-20f, 0x1.cb4a9ap-21f, 0x1.30c94ep-21f, 0x1.948360p-22f},
    {{1, 0, 0x1.14a282p-1f, 0x1.aed548p-1f},
     {1, 1, 0x1.9357c8p-1f, 0x1.3b5ed4p-1f},
     {1, 7, 0x1.ff2d98p-1f, 0x1.cffd34p-5f},
     {1, 15, 0x1.ffffe0p-1f, 0x1.67a232p-10f},
     {1, 16, 0x1.fffffcp-1f, 0x1.132ba4p-11f},
     {1, 20, 0x1.000000p+0f, 0x1.1f91f0p-15f},
     {1, 31, 0x1.000000p+0f, 0x1.948360p-22f},
     {100000, 0, -0x1.ffac38p-1f, 0x1.24daaap-5f},
     {100000, 1, -0x1.ee581cp-1f, -0x1.0a978ep-2f},
     {100000, 7, 0x1.c8325cp-1f, -0x1.d0e184p-2f},
     {100000, 15, 0x1.02de72p-1f, -0x1.b9bc78p-1f},
     {100000, 16, -0x1.352c1ep-1f, 0x1.981d02p-1f},
     {100000, 20, -0x1.eb2100p-1f, -0x1.21636cp-2f},
     {100000, 31, 0x1.ffa300p-1f, 0x1.348bccp-5f}}};
// kLinearMscaleAllDim: rope_parameters = {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 2.5, 'mscale_all_dim': 0.707}, qk_rope_head_dim 64, qk_head_dim 96
const HfRopeReference kLinearMscaleAllDim = {
    1.0,  // attention_scaling
    0.11571391435450994,  // DeepseekV3Attention.scaling
    {0x1.99999ap-2f, 0x1.33281cp-2f, 0x1.ccab86p-3f, 0x1.59742cp-3f, 0x1.030dc4p-3f, 0x1.84869ep-4f, 0x1.235a72p-4f, 0x1.b4f7e4p-5f, 0x1.47ae14p-5f, 0x1.eb735cp-6f, 0x1.708936p-6f, 0x1.145ceep-6f, 0x1.9e7c70p-7f, 0x1.36d218p-7f, 0x1.d22a50p-8f, 0x1.5d931cp-8f, 0x1.0624dcp-8f, 0x1.89291ap-9f, 0x1.26d42cp-9f, 0x1.ba2e4ap-10f, 0x1.4b96c0p-10f, 0x1.f1502ap-11f, 0x1.74eea6p-11f, 0x1.17a8e4p-11f, 0x1.a36e30p-12f, 0x1.3a8746p-12f, 0x1.d7b9e0p-13f, 0x1.61bea2p-13f, 0x1.094566p-13f, 0x1.8dd9bcp-14f, 0x1.2a5884p-14f, 0x1.bf74a0p-15f},
    {{77, 0, 0x1.a1ea1ap-1f, -0x1.27ca24p-1f},
     {77, 1, -0x1.cb5ebep-2f, -0x1.c99716p-1f},
     {77, 7, -0x1.234428p-1f, -0x1.a5145ep-1f},
     {77, 15, 0x1.d56af8p-1f, 0x1.98db3ap-2f},
     {77, 16, 0x1.e7e7fcp-1f, 0x1.366dd4p-2f},
     {77, 20, 0x1.fd92cap-1f, 0x1.8e4ffap-4f},
     {77, 31, 0x1.fffee6p-1f, 0x1.0d2bf6p-8f}}};

RopeConfig deepseek_v3_yarn() {
  RopeConfig c;
  c.theta = 10000.0;
  c.rotary_dim = 64;
  c.scaling = RopeConfig::Scaling::kYarn;
  c.factor = 40.0;
  c.original_max_position_embeddings = 4096;
  c.max_position_embeddings = 163840;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.mscale = 1.0;
  c.mscale_all_dim = 1.0;
  return c;
}

RopeConfig mscale_no_truncate() {
  RopeConfig c;
  c.theta = 10000.0;
  c.rotary_dim = 64;
  c.scaling = RopeConfig::Scaling::kYarn;
  c.factor = 8.0;
  c.original_max_position_embeddings = 2048;
  c.max_position_embeddings = 163840;
  c.beta_fast = 16;
  c.beta_slow = 2;
  c.mscale = 0.707;
  c.mscale_all_dim = 0.5;
  c.truncate = false;
  return c;
}

RopeConfig linear(double factor) {
  RopeConfig c;
  c.theta = 10000.0;
  c.rotary_dim = 64;
  c.scaling = RopeConfig::Scaling::kLinear;
  c.factor = factor;
  return c;
}

RopeConfig llama3() {
  RopeConfig c;
  c.theta = 500000.0;
  c.rotary_dim = 64;
  c.scaling = RopeConfig::Scaling::kLlama3;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position_embeddings = 8192;
  return c;
}

RopeConfig default_theta_1e6() {
  RopeConfig c;
  c.theta = 1e6;
  c.rotary_dim = 64;
  return c;
}

void expect_matches_hf(const RopeConfig& config, const HfRopeReference& ref) {
  const auto inv_freq = rope_inv_freq(config);
  ASSERT_EQ(inv_freq.size(), ref.inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(inv_freq[i]), std::bit_cast<uint32_t>(ref.inv_freq[i])) << "inv_freq " << i;
  const double attention_factor = rope_attention_factor(config);
  EXPECT_DOUBLE_EQ(attention_factor, ref.attention_scaling);
  EXPECT_NEAR(yarn_attention_scale(config, std::pow(96.0, -0.5)), ref.softmax_scale, 1e-15);
  for (const auto& e : ref.cos_sin) {
    float c[32], s[32];
    rope_cos_sin(inv_freq.data(), 32, attention_factor, &e.position, 1, c, s);
    // Same fp32 angle as HF; cos/sin themselves may differ from torch's vectorised fp32 cos/sin by an ulp.
    EXPECT_NEAR(c[e.index], e.cos, 2e-7) << "position " << e.position << " index " << e.index;
    EXPECT_NEAR(s[e.index], e.sin, 2e-7) << "position " << e.position << " index " << e.index;
  }
}

TEST(Rope, YarnDeepseekV3MatchesTransformers) { expect_matches_hf(deepseek_v3_yarn(), kDeepseekV3Yarn); }
TEST(Rope, YarnWithMscaleRatioAndNoTruncationMatchesTransformers) {
  expect_matches_hf(mscale_no_truncate(), kMscaleNoTruncate);
}
TEST(Rope, DefaultMatchesTransformers) { expect_matches_hf(default_theta_1e6(), kDefaultTheta1e6); }
TEST(Rope, LinearMatchesTransformers) { expect_matches_hf(linear(4.0), kLinearFactor4); }
// transformers' yarn_apply_mscale scales the softmax by mscale_all_dim for every rope type but default.
TEST(Rope, LinearWithMscaleAllDimScalesTheSoftmaxAsTransformers) {
  RopeConfig c = linear(2.5);
  c.mscale_all_dim = 0.707;
  expect_matches_hf(c, kLinearMscaleAllDim);
}
// theta 5e5 over 64 dims against an 8192-token original context: pairs 0-14 keep their frequency (wavelength below
// 2048), 15-16 fall in the blended band, 17-31 divide by 8.
TEST(Rope, Llama3MatchesTransformersInEachBand) { expect_matches_hf(llama3(), kLlama3); }

TEST(Rope, YarnFactorDefaultsToContextRatio) {
  RopeConfig explicit_factor = deepseek_v3_yarn();
  RopeConfig implied = explicit_factor;
  implied.factor.reset();
  implied.max_position_embeddings = 4096 * 40;
  EXPECT_EQ(rope_inv_freq(implied), rope_inv_freq(explicit_factor));
  EXPECT_DOUBLE_EQ(yarn_attention_scale(implied, 1.0), std::pow(0.1 * std::log(40.0) + 1.0, 2));
  EXPECT_DOUBLE_EQ(yarn_attention_scale(default_theta_1e6(), 0.5), 0.5);
}

// A direct formula in fp64: rotate pair (a, b) by angle p·inv_freq[i].
struct Rotated {
  double first, second;
};
Rotated rotate(double a, double b, double angle) {
  return {a * std::cos(angle) - b * std::sin(angle), b * std::cos(angle) + a * std::sin(angle)};
}

TEST(Rope, InterleavedReadsPairsAndWritesHalfSplit) {
  const int64_t n = 3, heads = 5, nope = 7, rot = 16, head_stride = nope + rot + 2;
  const RopeConfig config = default_theta_1e6();
  RopeConfig small = config;
  small.rotary_dim = rot;
  const auto inv_freq = rope_inv_freq(small);
  const int64_t positions[n] = {0, 9, 1000};
  std::vector<float> cos(n * rot / 2), sin(n * rot / 2);
  rope_cos_sin(inv_freq.data(), rot / 2, 1.0, positions, n, cos.data(), sin.data());
  auto x = test::random_floats(n * heads * head_stride, 21);
  const auto original = x;
  // The rope part sits after the nope part of each head, as in MLA's q = [q_nope, q_pe].
  apply_rope_interleaved(x.data() + nope, n, heads, heads * head_stride, head_stride, cos.data(), sin.data(), rot);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = &original[(t * heads + h) * head_stride];
      const float* out = &x[(t * heads + h) * head_stride];
      for (int64_t i = 0; i < nope; ++i) ASSERT_EQ(out[i], in[i]);
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double angle = static_cast<double>(static_cast<float>(positions[t]) * inv_freq[i]);
        const Rotated r = rotate(in[nope + 2 * i], in[nope + 2 * i + 1], angle);
        ASSERT_NEAR(out[nope + i], r.first, 1e-6);
        ASSERT_NEAR(out[nope + rot / 2 + i], r.second, 1e-6);
      }
      for (int64_t i = nope + rot; i < head_stride; ++i) ASSERT_EQ(out[i], in[i]);
    }
}

TEST(Rope, HalfSplitRotatesFirstWithSecondHalf) {
  const int64_t n = 4, heads = 2, rot = 64, head_stride = 128;  // the DSA indexer: rope part first
  const auto inv_freq = rope_inv_freq(deepseek_v3_yarn());
  const int64_t positions[n] = {1, 2, 4095, 70000};
  std::vector<float> cos(n * 32), sin(n * 32);
  rope_cos_sin(inv_freq.data(), 32, 1.0, positions, n, cos.data(), sin.data());
  auto x = test::random_floats(n * heads * head_stride, 22);
  const auto original = x;
  apply_rope_half_split(x.data(), n, heads, heads * head_stride, head_stride, cos.data(), sin.data(), rot);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = &original[(t * heads + h) * head_stride];
      const float* out = &x[(t * heads + h) * head_stride];
      for (int64_t i = 0; i < 32; ++i) {
        const double angle = static_cast<double>(static_cast<float>(positions[t]) * inv_freq[i]);
        const Rotated r = rotate(in[i], in[32 + i], angle);
        ASSERT_NEAR(out[i], r.first, 1e-6);
        ASSERT_NEAR(out[32 + i], r.second, 1e-6);
      }
      for (int64_t i = rot; i < head_stride; ++i) ASSERT_EQ(out[i], in[i]);
    }
}

// HF's docstring claim: interleaved == rotate_half applied to the de-interleaved input, bit for bit.
TEST(Rope, InterleavedEqualsHalfSplitOfDeinterleavedInput) {
  const int64_t n = 2, rot = 64;
  const auto inv_freq = rope_inv_freq(deepseek_v3_yarn());
  const int64_t positions[n] = {5, 123456};
  std::vector<float> cos(n * 32), sin(n * 32);
  rope_cos_sin(inv_freq.data(), 32, 1.0, positions, n, cos.data(), sin.data());
  auto x = test::random_floats(n * rot, 23);
  std::vector<float> deinterleaved(x.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < rot / 2; ++i) {
      deinterleaved[t * rot + i] = x[t * rot + 2 * i];
      deinterleaved[t * rot + rot / 2 + i] = x[t * rot + 2 * i + 1];
    }
  apply_rope_interleaved(x.data(), n, 1, rot, rot, cos.data(), sin.data(), rot);
  apply_rope_half_split(deinterleaved.data(), n, 1, rot, rot, cos.data(), sin.data(), rot);
  EXPECT_EQ(x, deinterleaved);
}

}  // namespace
}  // namespace kiln::cpu
