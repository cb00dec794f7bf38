// The server `kiln qualify` measures: `kiln serve RECIPE --port 0` as a child process (this same binary), its output in
// a log file that becomes an artifact of the qualification. The child is always reaped: stop() or the destructor
// sends SIGTERM (the server drains), then SIGKILL when it outlasts the grace period; and it gets SIGTERM when this
// process dies first (PR_SET_PDEATHSIG), so an interrupted qualification leaves no server behind.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "serve_client.h"

namespace kiln::cli {

class ChildServer {
 public:
  ChildServer() = default;
  ChildServer(const ChildServer&) = delete;
  ChildServer& operator=(const ChildServer&) = delete;
  ~ChildServer() { stop(); }

  // Starts it and waits (at most `timeout_s`) until it prints its address and GET /health answers 200. `args` follow
  // `kiln serve RECIPE` (--set, --plugin-dir). An error message, or "".
  // `port` 0: any free port, which the server picks and prints.
  std::string start(const std::string& recipe, int port, const std::vector<std::string>& args,
                    const std::string& log_path, int timeout_s);
  const ServerAddress& address() const { return address_; }
  // False once the child has exited; exit_text() then says how.
  bool alive();
  std::string exit_text() const { return exit_text_; }
  // The log's last lines, for an error message about a child that failed.
  std::string log_tail(int lines) const;
  // The log line carrying `needle` (the prefix spdlog adds cut off), or "".
  std::string log_line(const std::string& needle) const;
  // SIGTERM, wait up to `grace_s` for the drain, then SIGKILL; reaps the child. Returns how it ended.
  std::string stop(int grace_s = 30);

 private:
  void reaped(int status);

  pid_t pid_ = -1;
  ServerAddress address_;
  std::string log_path_, exit_text_;
};

}  // namespace kiln::cli
