// The launcher's and the rank tests' port choice: below the kernel's ephemeral range, bindable when chosen.
#include "parallel/loopback_ports.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kiln {
namespace {

// A listener on a port of the kernel's choosing, closed at the end of the scope.
struct Listener {
  int fd = -1, port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

TEST(LoopbackPorts, AListenedPortIsNotBindableAndAFreedOneIs) {
  int port = 0;
  {
    Listener l;
    ASSERT_GT(l.port, 0);
    port = l.port;
    EXPECT_FALSE(loopback_port_bindable(port));
  }
  EXPECT_TRUE(loopback_port_bindable(port));  // a listener that never accepted leaves no TIME_WAIT behind
  EXPECT_FALSE(loopback_port_bindable(0));
  EXPECT_FALSE(loopback_port_bindable(65536));
}

TEST(LoopbackPorts, WindowStaysOutOfTheEphemeralRange) {
  struct Case {
    PortRange ephemeral;
    int count;
    PortRange want;
  };
  const Case cases[] = {
      {{32768, 60999}, 1, {20000, 32767}},  // Linux's default
      {{32768, 60999}, 4, {20000, 32764}},  // the last base's 4 ports end at 32767
      {{49152, 65535}, 3, {20000, 49149}},  // the IANA range (some distributions)
      {{10000, 60999}, 2, {1024, 9998}},    // a low range: below 20000
      {{1024, 60999}, 3, {61000, 65533}},   // nothing below: above its high end
      {{1024, 65535}, 1, {1, 0}},           // the whole space is ephemeral: none
  };
  for (const Case& c : cases) {
    const PortRange w = rank_port_window(c.ephemeral, c.count);
    EXPECT_EQ(w.low, c.want.low) << c.ephemeral.low << "-" << c.ephemeral.high << " count " << c.count;
    EXPECT_EQ(w.high, c.want.high) << c.ephemeral.low << "-" << c.ephemeral.high << " count " << c.count;
  }
}

TEST(LoopbackPorts, ChosenPortsLieBelowTheEphemeralRangeAndWereFree) {
  const PortRange ephemeral = ephemeral_port_range();
  ASSERT_LE(ephemeral.low, ephemeral.high);
  for (int count : {1, 2, 5}) {
    for (int i = 0; i < 20; ++i) {
      Result<int> base = free_loopback_ports(count);
      ASSERT_TRUE(base.ok()) << base.status().to_string();
      const PortRange w = rank_port_window(ephemeral, count);
      EXPECT_GE(*base, w.low);
      EXPECT_LE(*base, w.high);
      EXPECT_TRUE(*base + count - 1 < ephemeral.low || *base > ephemeral.high) << *base << " +" << count;
    }
  }
}

}  // namespace
}  // namespace kiln
