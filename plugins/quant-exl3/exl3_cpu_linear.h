// The `exl3` format's CPU objects: a Linear over stacked modules, each EXL3 (decoded on the fly from the trellis,
// so the weights stay at their compressed size) or dense (a checkpoint module the quantizer left unquantized),
// and the per-expert SwiGLU ExpertSet built from such Linears.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exl3_module.h"
#include "kiln/weight_format.h"

namespace kiln::exl3 {

// One module of a stack: exactly one of `quantized` and `dense` is set.
struct Part {
  std::string name;
  int64_t out = 0;
  std::optional<Module> quantized;
  TensorView dense;       // [out, in] F32/BF16/F16, a view into the checkpoint
  TensorView dense_bias;  // [out] or empty
};

// Reads `name` as EXL3 when it is one (specs/exl3.md §1), else as a dense `<name>.weight`.
Result<Part> read_part(const WeightSource& source, const std::string& name, int64_t in, int64_t out);

Result<std::unique_ptr<Linear>> make_cpu_linear(std::vector<Part> parts, int64_t in);

struct ExpertLinears {
  std::unique_ptr<Linear> gate, up, down;
};
std::unique_ptr<ExpertSet> make_cpu_expert_set(std::string prefix, std::vector<ExpertLinears> experts, int64_t hidden,
                                               int64_t inter);

}  // namespace kiln::exl3
