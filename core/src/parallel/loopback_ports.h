// Ports for ranks meeting on one machine: a base with `count` consecutive TCP ports bindable on 127.0.0.1, picked
// below the kernel's ephemeral range. A port inside that range (32768–60999 by default on Linux) is one the kernel
// also hands to outgoing connections — the ranks' own and other processes' — so between the probe here and rank 0's
// listen it can be taken ("Address already in use", or a rank connecting to someone else's listener). Used by the
// launcher (kiln serve / generate without --master-port) and by the tests that start rendezvous.
#pragma once

#include "kiln/status.h"

namespace kiln {

// Whether `port` can be bound on 127.0.0.1 right now (the probe binds and closes at once).
bool loopback_port_bindable(int port);

// The kernel's ephemeral range from /proc/sys/net/ipv4/ip_local_port_range, or Linux's default 32768–60999.
struct PortRange {
  int low = 0, high = 0;  // inclusive
};
PortRange ephemeral_port_range();

// Where to look for `count` consecutive ports outside `ephemeral`: [20000, low) when it fits, else below 20000
// down to 1024, else above its high end; an empty range (low > high) when none fits.
PortRange rank_port_window(PortRange ephemeral, int count);

// A random base in that window whose `count` ports are all bindable now (64 tries). Someone may still take one
// before the ranks listen; rank 0 then names the port it could not listen on. The error asks for --master-port.
Result<int> free_loopback_ports(int count);

}  // namespace kiln
