#include "kiln/launch_env.h"

#include <charconv>
#include <cstdlib>

namespace kiln {
namespace {

// An integer in [lo, hi] from `name`, or the fallback when unset.
Result<int> read_int(const EnvLookup& env, const std::string& name, int fallback, int lo, int hi) {
  const auto text = env(name);
  if (!text) return fallback;
  int value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || ptr != end)
    return invalid_argument("environment variable " + name + "=\"" + *text + "\" is not an integer");
  if (value < lo || value > hi)
    return out_of_range("environment variable " + name + "=" + *text + " is outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return value;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

Result<LaunchEnv> read_launch_env(const EnvLookup& env) {
  LaunchEnv out;
  KILN_ASSIGN_OR_RETURN(out.world_size, read_int(env, "WORLD_SIZE", 1, 1, 1 << 16));
  KILN_ASSIGN_OR_RETURN(out.rank, read_int(env, "RANK", 0, 0, 1 << 16));
  if (out.rank >= out.world_size)
    return out_of_range("RANK=" + std::to_string(out.rank) + " but WORLD_SIZE=" + std::to_string(out.world_size) +
                        " (ranks are 0.." + std::to_string(out.world_size - 1) + ")");
  // Without LOCAL_RANK every rank is taken to be on its own node, which is right for one node per rank only:
  // launchers always set it.
  KILN_ASSIGN_OR_RETURN(out.local_rank, read_int(env, "LOCAL_RANK", out.world_size == 1 ? 0 : out.rank, 0, 1 << 16));
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) return invalid_argument("environment variable MASTER_ADDR is set but empty");
    out.master_addr = *addr;
  }
  KILN_ASSIGN_OR_RETURN(out.master_port, read_int(env, "MASTER_PORT", 0, 1, 65535));
  if (out.world_size > 1 && out.master_port == 0)
    return invalid_argument("WORLD_SIZE=" + std::to_string(out.world_size) +
                            " needs MASTER_PORT (and MASTER_ADDR, default 127.0.0.1): the address where rank 0 "
                            "serves the NCCL unique id");
  KILN_ASSIGN_OR_RETURN(const int timeout_s, read_int(env, "KILN_RENDEZVOUS_TIMEOUT_S", 300, 1, 24 * 3600));
  out.rendezvous_timeout = std::chrono::seconds(timeout_s);
  return out;
}

RendezvousSpec rendezvous_spec(const LaunchEnv& launch) {
  RendezvousSpec spec;
  spec.addr = launch.master_addr;
  spec.port = launch.master_port;
  spec.rank = launch.rank;
  spec.world_size = launch.world_size;
  spec.timeout = launch.rendezvous_timeout;
  return spec;
}

}  // namespace kiln
