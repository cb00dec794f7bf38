// The keys the `nccl` collective adds to [transport], and their values as the collective reads them.
#pragma once

#include <chrono>
#include <string>

#include "kiln/recipe.h"
#include "kiln/status.h"

namespace kiln::nccl {

// auto: probe once, use the custom all-reduce when the probe passes, NCCL otherwise (one log line says why);
// on: the probe must pass, else creating the collective fails; off: NCCL only, no probe.
enum class CustomAllReduceMode { kAuto, kOn, kOff };

struct TransportSettings {
  CustomAllReduceMode custom_all_reduce = CustomAllReduceMode::kAuto;
  bool force_probe_failure = false;  // transport.custom_all_reduce_force_fail: exercises the fallback
  StringTable env;                   // NCCL_* settings, checked
  // transport.timeout_s: how long the communicator's creation, or any enqueued collective, may take before the
  // watchdog aborts the communicator (comm_watchdog.h).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

SectionSchema transport_schema();

// Reads [transport] (defaults where `section` is null); refuses env names that are not NCCL settings.
Result<TransportSettings> read_transport_settings(const RecipeSection* section);

const char* mode_name(CustomAllReduceMode mode);

}  // namespace kiln::nccl
