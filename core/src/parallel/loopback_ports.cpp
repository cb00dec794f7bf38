#include "parallel/loopback_ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>

namespace kiln {

bool loopback_port_bindable(int port) {
  if (port <= 0 || port > 65535) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

PortRange ephemeral_port_range() {
  PortRange r{32768, 60999};
  if (std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range"); f) {
    PortRange read;
    if (f >> read.low >> read.high && read.low > 0 && read.low <= read.high) r = read;
  }
  return r;
}

PortRange rank_port_window(PortRange ephemeral, int count) {
  constexpr int kPreferredLow = 20000, kLowest = 1024, kHighest = 65535;
  count = std::max(count, 1);
  // The base b and its ports b .. b+count-1 all below the ephemeral range.
  if (ephemeral.low - count >= kPreferredLow) return {kPreferredLow, ephemeral.low - count};
  if (ephemeral.low - count >= kLowest) return {kLowest, ephemeral.low - count};
  if (kHighest - ephemeral.high >= count) return {ephemeral.high + 1, kHighest - count + 1};
  return {1, 0};
}

Result<int> free_loopback_ports(int count) {
  const PortRange ephemeral = ephemeral_port_range();
  const PortRange window = rank_port_window(ephemeral, count);
  const std::string what = std::to_string(count) + " consecutive free TCP port" + (count == 1 ? "" : "s") +
                           " on 127.0.0.1 outside the kernel's ephemeral range " + std::to_string(ephemeral.low) +
                           "–" + std::to_string(ephemeral.high) + " (net.ipv4.ip_local_port_range)";
  if (window.low > window.high) return unavailable("there is no room for " + what + "; give --master-port");
  std::mt19937 gen(static_cast<uint32_t>(::getpid()) * 2654435761u ^
                   static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(window.low, window.high);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int base = pick(gen);
    bool all = true;
    for (int i = 0; i < count && all; ++i) all = loopback_port_bindable(base + i);
    if (all) return base;
  }
  return unavailable("found no " + what + " in " + std::to_string(window.low) + "–" +
                     std::to_string(window.high + count - 1) + "; give --master-port");
}

}  // namespace kiln
