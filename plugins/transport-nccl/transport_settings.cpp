#include "transport_settings.h"

#include "nccl_env_settings.h"

namespace kiln::nccl {

SectionSchema transport_schema() {
  KeySpec mode;
  mode.name = "custom_all_reduce";
  mode.type = ValueType::kString;
  mode.default_value = std::string("auto");
  mode.allowed = {"auto", "on", "off"};
  mode.doc =
      "CUDA-IPC all-reduce (one-shot small, two-shot large): auto = probe once, NCCL if the probe fails; "
      "on = the probe must pass; off = NCCL only";
  KeySpec force;
  force.name = "custom_all_reduce_force_fail";
  force.type = ValueType::kBool;
  force.default_value = false;
  force.doc = "make the custom all-reduce probe fail (tests the fallback to NCCL)";
  KeySpec env;
  env.name = "env";
  env.type = ValueType::kStringTable;
  env.default_value = StringTable{};
  env.doc =
      "NCCL_* environment variables set before NCCL initialises, e.g. { NCCL_CUMEM_ENABLE = \"0\" }; a variable "
      "the environment already sets keeps its value";
  // The same key as the built-in `socket` collective's (one bound for a rank that hangs, whichever transport).
  KeySpec timeout;
  timeout.name = "timeout_s";
  timeout.type = ValueType::kInteger;
  timeout.default_value = int64_t{300};
  timeout.min = 1;
  timeout.max = 24 * 3600;
  timeout.doc =
      "seconds a rank may wait for the others in one collective call (a rank that hangs): then the call fails on "
      "every rank still alive, naming the ranks that did not arrive, and the tensor-parallel group ends";
  return {{mode, force, env, timeout}};
}

Result<TransportSettings> read_transport_settings(const RecipeSection* section) {
  TransportSettings out;
  if (!section) return out;
  const std::string mode = section->get_string("custom_all_reduce", "auto");
  if (mode == "auto")
    out.custom_all_reduce = CustomAllReduceMode::kAuto;
  else if (mode == "on")
    out.custom_all_reduce = CustomAllReduceMode::kOn;
  else if (mode == "off")
    out.custom_all_reduce = CustomAllReduceMode::kOff;
  else
    return section->error("custom_all_reduce", "\"" + mode + "\" is not one of auto, on, off");
  out.force_probe_failure = section->get_bool("custom_all_reduce_force_fail", false);
  out.env = section->get_table("env");
  out.timeout = std::chrono::seconds(section->get_int("timeout_s", 300));
  if (Status s = check_nccl_env(out.env); !s.ok()) return section->error("env", s.message());
  return out;
}

const char* mode_name(CustomAllReduceMode mode) {
  switch (mode) {
    case CustomAllReduceMode::kAuto:
      return "auto";
    case CustomAllReduceMode::kOn:
      return "on";
    case CustomAllReduceMode::kOff:
      return "off";
  }
  return "?";
}

}  // namespace kiln::nccl
