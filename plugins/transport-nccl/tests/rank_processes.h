// Starts `world` copies of the rank helper as separate processes (rank r gets RANK=r, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), each with stdout and stderr in <dir>/rank<r>.log, and waits for them with a time limit.
// exec, not a bare fork: CUDA does not survive a fork after the parent initialised it.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"

namespace kiln::nccl::testing {

struct RankRun {
  std::vector<int> exit_codes;  // −1: killed at the time limit or by a signal
  std::vector<std::string> logs;
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline RankRun run_ranks(const std::string& helper, int world, const std::vector<std::string>& args,
                         const std::filesystem::path& dir, std::chrono::seconds limit = std::chrono::seconds(120)) {
  std::filesystem::create_directories(dir);
  const int port = free_loopback_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("KILN_RENDEZVOUS_TIMEOUT_S", "60", 1);
      const std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
      if (!std::freopen(log.c_str(), "w", stdout) || !std::freopen(log.c_str(), "a", stderr)) _exit(126);
      std::vector<std::string> argv_s = {helper};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      argv_s.push_back(dir.string());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(helper.c_str(), argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  RankRun run;
  run.exit_codes.assign(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        run.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) run.logs.push_back(read_text(dir / ("rank" + std::to_string(r) + ".log")));
  return run;
}

}  // namespace kiln::nccl::testing
