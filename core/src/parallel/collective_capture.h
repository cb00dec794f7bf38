// Whether a collective's calls may be captured into a CUDA graph. The SDK's contract asks it of every collective a
// plugin provides (kiln/collective.h), and `nccl` keeps it. A collective the core builds to meet through host memory
// (runtime/cuda/host_staged_collective.h: it waits for the stream and copies through the host) cannot keep it, and
// says so by implementing HostMeetingCollective; a CUDA runner then runs its steps directly instead of replaying
// graphs. A property of the collective, so that no runner asks for a backend by name.
#pragma once

#include <string>

#include "kiln/collective.h"

namespace kiln {

class HostMeetingCollective {
 public:
  virtual ~HostMeetingCollective() = default;
  // Why its calls cannot be captured (for logs).
  virtual std::string why_not_capturable() const = 0;
  // The host collective it meets through (what the rank processes end their calls in: parallel/rank_processes.h).
  virtual Collective& host_collective() = 0;
};

inline bool collective_capturable(const Collective& c) { return dynamic_cast<const HostMeetingCollective*>(&c) == nullptr; }

// The collective the ranks' host-side machinery talks to: `c` itself, or the one a host-meeting collective wraps.
inline Collective* host_side(Collective* c) {
  auto* staged = dynamic_cast<HostMeetingCollective*>(c);
  return staged ? &staged->host_collective() : c;
}

}  // namespace kiln
