#include "exl3_module.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

#include "exl3_half.h"
#include "exl3_tile.h"

namespace kiln::exl3 {
namespace {

constexpr int64_t kPad = 128;  // upstream pads both dims to the Hadamard block

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

Status need_host(const std::string& tensor, const TensorView& t) {
  if (!t.device.is_cpu() || !t.is_contiguous())
    return invalid_argument("tensor `" + tensor + "` must be a contiguous host tensor (got " + t.device.to_string() + ")");
  return ok_status();
}

// An fp16 (or fp32, or bf16) scale vector of `length`.
Result<std::vector<float>> read_scales(const WeightSource& source, const std::string& tensor, int64_t length) {
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(tensor));
  KILN_RETURN_IF_ERROR(need_host(tensor, t));
  if (t.rank != 1 || t.shape[0] != length)
    return invalid_argument("tensor `" + tensor + "` has shape " + t.shape_string() + ", the trellis implies [" +
                            std::to_string(length) + "]");
  std::vector<float> v(static_cast<size_t>(length));
  if (t.dtype == DType::kF16) {
    for (int64_t i = 0; i < length; ++i) v[i] = half_to_float(t.as<const uint16_t>()[i]);
  } else if (t.dtype == DType::kF32) {
    std::copy_n(t.as<const float>(), length, v.begin());
  } else if (t.dtype == DType::kBF16) {
    // model.precision = "bf16" hands every float tensor over rounded to bf16 (the CUDA runner's rounding).
    for (int64_t i = 0; i < length; ++i) v[i] = std::bit_cast<float>(static_cast<uint32_t>(t.as<const uint16_t>()[i]) << 16);
  } else {
    return invalid_argument("tensor `" + tensor + "` is " + dtype_name(t.dtype) + ", expected F16");
  }
  return v;
}

// Legacy packed signs: bit j of int16 word i is element 16i + j, 1 → −1.
Result<std::vector<float>> read_signs(const WeightSource& source, const std::string& tensor, int64_t length) {
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(tensor));
  KILN_RETURN_IF_ERROR(need_host(tensor, t));
  if (t.dtype != DType::kI16 || t.rank != 1 || t.shape[0] * 16 != length)
    return invalid_argument("tensor `" + tensor + "` is " + dtype_name(t.dtype) + " " + t.shape_string() +
                            ", the trellis implies I16 [" + std::to_string(length / 16) + "] (packed sign bits)");
  std::vector<float> v(static_cast<size_t>(length));
  const auto* w = t.as<const uint16_t>();
  for (int64_t i = 0; i < length; ++i) v[i] = ((w[i / 16] >> (i % 16)) & 1u) ? -1.0f : 1.0f;
  return v;
}

Result<std::vector<float>> read_side(const WeightSource& source, const std::string& name, const char* scaled,
                                     const char* signs, int64_t length) {
  if (source.has(name + "." + scaled)) return read_scales(source, name + "." + scaled, length);
  if (source.has(name + "." + signs)) return read_signs(source, name + "." + signs, length);
  return not_found("`" + name + ".trellis` has no `" + name + "." + scaled + "` (nor legacy `." + signs +
                   "`): the module's scales are missing");
}

// `.mcg` / `.mul1`: an int32 flag whose value names the multiplier; another value is a codebook we cannot decode.
Status check_flag(const WeightSource& source, const std::string& tensor, uint32_t expected) {
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(tensor));
  KILN_RETURN_IF_ERROR(need_host(tensor, t));
  if (t.dtype != DType::kI32 || t.numel() != 1)
    return invalid_argument("tensor `" + tensor + "` is " + dtype_name(t.dtype) + " " + t.shape_string() +
                            ", expected a 0-dim I32 codebook flag");
  uint32_t value = 0;
  std::memcpy(&value, t.data, 4);
  if (value != expected) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08X (this decoder knows 0x%08X)", value, expected);
    return invalid_argument("tensor `" + tensor + "` holds codebook multiplier " + buf +
                            ": an unknown codebook variant");
  }
  return ok_status();
}

}  // namespace

bool is_exl3_module(const WeightSource& source, const std::string& name) {
  return source.has(name + ".trellis") && (source.has(name + ".suh") || source.has(name + ".su")) &&
         (source.has(name + ".svh") || source.has(name + ".sv"));
}

bool has_exl3_tensors(const WeightSource& source, const std::string& name) {
  for (const char* s : {".trellis", ".suh", ".su", ".svh", ".sv", ".mcg", ".mul1"})
    if (source.has(name + s)) return true;
  return false;
}

bool all_stored_dense(const WeightSource& source, const std::vector<std::string>& names) {
  for (const std::string& name : names)
    if (has_exl3_tensors(source, name)) return false;
  return true;
}

bool experts_stored_dense(const WeightSource& source, const std::string& prefix, int64_t num_experts) {
  for (int64_t e = 0; e < num_experts; ++e)
    for (const char* proj : {".gate_proj", ".up_proj", ".down_proj"})
      if (has_exl3_tensors(source, prefix + "." + std::to_string(e) + proj)) return false;
  return true;
}

Result<Module> read_module(const WeightSource& source, const std::string& name, int64_t in, int64_t out) {
  Module m;
  m.name = name;
  m.in = in;
  m.out = out;
  const std::string trellis = name + ".trellis";
  if (!source.has(trellis))
    return not_found("`" + name + "` has EXL3 tensors but no `" + trellis + "`");
  KILN_ASSIGN_OR_RETURN(TensorView t, source.get(trellis));
  KILN_RETURN_IF_ERROR(need_host(trellis, t));
  if (t.dtype != DType::kI16 || t.rank != 3)
    return invalid_argument("tensor `" + trellis + "` is " + dtype_name(t.dtype) + " " + t.shape_string() +
                            ", expected I16 [in/16, out/16, 16·K]");
  if (t.shape[2] % 16 != 0 || t.shape[2] / 16 < 1 || t.shape[2] / 16 > kMaxBits)
    return invalid_argument("tensor `" + trellis + "` has last dim " + std::to_string(t.shape[2]) +
                            ": K = last dim / 16 must be an integer in 1.." + std::to_string(kMaxBits));
  m.bits = static_cast<int>(t.shape[2] / 16);
  m.k_pad = t.shape[0] * 16;
  m.n_pad = t.shape[1] * 16;
  if (m.k_pad != round_up(in, kPad) || m.n_pad != round_up(out, kPad))
    return invalid_argument("tensor `" + trellis + "` has shape " + t.shape_string() + " (a padded [" +
                            std::to_string(m.k_pad) + " in, " + std::to_string(m.n_pad) + " out] matrix), but the " +
                            "config implies [" + std::to_string(in) + " in, " + std::to_string(out) +
                            " out], padded to 128: [" + std::to_string(round_up(in, kPad)) + ", " +
                            std::to_string(round_up(out, kPad)) + "]");
  m.trellis = t.as<const uint16_t>();

  const bool mcg = source.has(name + ".mcg"), mul1 = source.has(name + ".mul1");
  if (mcg && mul1)
    return invalid_argument("`" + name + "` has both `.mcg` and `.mul1` codebook flags; a module has one codebook");
  if (mcg) {
    KILN_RETURN_IF_ERROR(check_flag(source, name + ".mcg", kMcgMultiplier));
    m.codebook = Codebook::kMcg;
  } else if (mul1) {
    KILN_RETURN_IF_ERROR(check_flag(source, name + ".mul1", kMul1Multiplier));
    m.codebook = Codebook::kMul1;
  }

  KILN_ASSIGN_OR_RETURN(m.suh, read_side(source, name, "suh", "su", m.k_pad));
  KILN_ASSIGN_OR_RETURN(m.svh, read_side(source, name, "svh", "sv", m.n_pad));
  if (source.has(name + ".bias")) {
    // Stored padded (n_pad) or at the real width; only the real outputs are kept.
    KILN_ASSIGN_OR_RETURN(TensorView b, source.get(name + ".bias"));
    const int64_t length = b.rank == 1 && b.shape[0] == m.n_pad ? m.n_pad : out;
    KILN_ASSIGN_OR_RETURN(m.bias, read_scales(source, name + ".bias", length));
    m.bias.resize(static_cast<size_t>(out));
  }
  return m;
}

std::vector<float> decode_matrix(const Module& m) {
  std::vector<float> w(static_cast<size_t>(m.k_pad * m.n_pad));
  float tile[kTileValues];
  for (int64_t i = 0; i < m.k_pad / 16; ++i)
    for (int64_t j = 0; j < m.n_pad / 16; ++j) {
      decode_tile(m.tile(i, j), m.bits, m.codebook, tile);
      for (int r = 0; r < kTile; ++r) std::copy_n(tile + r * kTile, kTile, &w[(i * 16 + r) * m.n_pad + j * 16]);
    }
  return w;
}

void forward(const Module& m, const float* x, int64_t n, float* y) {
  // Rotated input: (x ⊙ suh)·Hb, zero in the padding.
  std::vector<float> xr(static_cast<size_t>(n * m.k_pad), 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < m.in; ++i) xr[r * m.k_pad + i] = x[r * m.in + i] * m.suh[i];
    hadamard128(&xr[r * m.k_pad], m.k_pad / kHadamard);
  }
  std::vector<float> yr(static_cast<size_t>(n * m.n_pad), 0.0f);
  const int64_t col_tiles = m.n_pad / 16, row_tiles = m.k_pad / 16;
  // One output tile column per iteration: its 16 columns are summed over input tiles in order, so threads never
  // share an output and the order does not depend on n.
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < col_tiles; ++j) {
    float tile[kTileValues];
    for (int64_t i = 0; i < row_tiles; ++i) {
      decode_tile(m.tile(i, j), m.bits, m.codebook, tile);
      for (int64_t r = 0; r < n; ++r) {
        float* acc = &yr[r * m.n_pad + j * 16];
        const float* xv = &xr[r * m.k_pad + i * 16];
        for (int k = 0; k < kTile; ++k)
          for (int c = 0; c < kTile; ++c) acc[c] += xv[k] * tile[k * kTile + c];
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    float* row = &yr[r * m.n_pad];
    hadamard128(row, m.n_pad / kHadamard);
    for (int64_t o = 0; o < m.out; ++o) y[r * m.out + o] = row[o] * m.svh[o] + (m.bias.empty() ? 0.0f : m.bias[o]);
  }
}

std::vector<float> dequantize(const Module& m) {
  std::vector<float> w = decode_matrix(m);
  // Hb·Ŵ: every column, in blocks of 128 rows; then ·Hb: every row.
  for (int64_t c = 0; c < m.n_pad; ++c) hadamard128(&w[c], m.k_pad / kHadamard, m.n_pad);
  for (int64_t r = 0; r < m.k_pad; ++r) hadamard128(&w[r * m.n_pad], m.n_pad / kHadamard);
  std::vector<float> out(static_cast<size_t>(m.out * m.in));
  for (int64_t o = 0; o < m.out; ++o)
    for (int64_t i = 0; i < m.in; ++i) out[o * m.in + i] = m.suh[i] * w[i * m.n_pad + o] * m.svh[o];
  return out;
}

}  // namespace kiln::exl3
