#include "rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "kiln/log.h"
#include "parallel/loopback_ports.h"
#include "parallel/rank_processes.h"

extern char** environ;

namespace kiln::cli {
namespace {

const char* const kRankVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                     "KILN_LAUNCHED_RANK"};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

}  // namespace

const char* const kRankLaunchHelp =
    "Ranks as processes (parallel.tensor = W > 1 with transport.backend = \"socket\"): this command starts the other "
    "W-1 ranks of this machine itself (the same command re-run with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
    "MASTER_PORT set) and is rank 0. Several machines: run it on each with --nnodes N --node-rank R --master-addr "
    "(node 0's address) --master-port P; node R runs ranks R*K .. R*K+K-1 (K = --nproc-per-node, default W/N). A "
    "process started with RANK/WORLD_SIZE already set (torchrun, a job script) is that one rank and starts nothing. "
    "The ranks meet at MASTER_PORT .. MASTER_PORT+1 (+ one port per decode-context group).";

void add_rank_launch_options(po::options_description& desc, RankLaunchOptions& opts) {
  desc.add_options()
      ("nnodes", po::value(&opts.nnodes)->default_value(1), "machines the ranks run on (ranks as processes)")
      ("node-rank", po::value(&opts.node_rank)->default_value(0), "this machine's place among --nnodes (0 runs rank 0)")
      ("nproc-per-node", po::value(&opts.nproc_per_node)->default_value(0),
       "rank processes on this machine (0 = parallel.tensor / --nnodes)")
      ("master-addr", po::value(&opts.master_addr), "address of node 0, where the ranks meet (default 127.0.0.1)")
      ("master-port", po::value(&opts.master_port), "first of the ports the ranks meet at (default: a free one)");
}

// ---- watching the rank processes ----

struct LocalRanks::Watch {
  struct Child {
    pid_t pid = 0;
    int rank = 0;
    int err = -1;  // read end of its stderr; −1 after EOF
    std::string partial;
    std::deque<std::string> tail;  // its last lines
    bool reaped = false;
    int status = 0;
    bool reported = false;  // its exit after start-up was logged
  };
  static constexpr size_t kTailLines = 20;

  std::mutex mu;  // guards children's reaped / status (the destructor reads them)
  std::vector<Child> children;
  std::atomic<bool> starting{true};
  std::atomic<bool> stop{false};
  std::thread thread;

  void run();
  // Reads what a child wrote to stderr and passes it on, line by line; false at EOF.
  bool forward(Child& c);
  void emit(Child& c, const std::string& line);
  [[noreturn]] void end_launch(const Child& failed);
  // The running group broke (a rank hung or went away): the ranks of this machine have nothing left to do, and a
  // rank that hangs would not notice, so they are stopped.
  void stop_ranks(const Status& why);
};

namespace {

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended (status " + std::to_string(status) + ")";
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void LocalRanks::Watch::emit(Child& c, const std::string& line) {
  write_all(STDERR_FILENO, "[rank " + std::to_string(c.rank) + "] " + line + "\n");
  c.tail.push_back(line);
  if (c.tail.size() > kTailLines) c.tail.pop_front();
}

bool LocalRanks::Watch::forward(Child& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(c.err, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) {
      if (!c.partial.empty()) emit(c, std::exchange(c.partial, {}));
      ::close(c.err);
      c.err = -1;
      return false;
    }
    c.partial.append(buf, static_cast<size_t>(n));
    for (size_t eol; (eol = c.partial.find('\n')) != std::string::npos;) {
      emit(c, c.partial.substr(0, eol));
      c.partial.erase(0, eol + 1);
    }
  }
}

void LocalRanks::Watch::end_launch(const Child& failed) {
  std::string report = "rank " + std::to_string(failed.rank) + " (pid " + std::to_string(failed.pid) + ") " +
                       describe_exit(failed.status) + " while the ranks were starting";
  if (failed.tail.empty()) {
    report += "; it wrote nothing to stderr";
  } else {
    report += "; its last lines:";
    for (const std::string& line : failed.tail) report += "\n  " + line;
  }
  std::string others;
  for (const Child& c : children)
    if (!c.reaped) others += (others.empty() ? "" : ", ") + std::to_string(c.rank);
  if (!others.empty()) report += "\nstopping the other rank(s) of this machine: " + others;
  log::error("{}", report);
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  // From here this process's own start-up fails too, because the ranks it stops close their connections; what it
  // would print about that only hides the cause just reported.
  if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, STDERR_FILENO);
  for (const Child& c : children)
    if (!c.reaped) ::kill(c.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (const Child& c : children) {
    if (c.reaped) continue;
    int status = 0;
    while (::waitpid(c.pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // This rank is blocked in its own start-up (a rendezvous, or loading): nothing it could still do helps.
  ::_exit(1);
}

void LocalRanks::Watch::stop_ranks(const Status& why) {
  std::lock_guard<std::mutex> lock(mu);
  std::string stopped;
  for (const Child& c : children)
    if (!c.reaped && ::kill(c.pid, SIGTERM) == 0) stopped += (stopped.empty() ? "" : ", ") + std::to_string(c.rank);
  if (!stopped.empty())
    log::warn("stopping the rank process(es) of this machine, rank(s) {}: {}", stopped, why.message());
}

void LocalRanks::Watch::run() {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Child*> of;
    for (Child& c : children)
      if (c.err >= 0) {
        fds.push_back({c.err, POLLIN, 0});
        of.push_back(&c);
      }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else if (::poll(fds.data(), fds.size(), 50) > 0) {
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents) forward(*of[i]);
    }
    bool all_done = true;
    for (Child& c : children) {
      bool reaped;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!c.reaped && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.reaped = true;
        reaped = c.reaped;
      }
      if (reaped && c.err >= 0) {
        // What it wrote last is in the pipe already: take it before judging.
        while (forward(c)) {
          pollfd p{c.err, POLLIN, 0};
          if (::poll(&p, 1, 200) <= 0) break;
        }
      }
      all_done &= reaped && c.err < 0;
    }
    if (starting) {
      for (Child& c : children) {
        if (!c.reaped) continue;
        // A grace moment: when rank 0 itself failed to start, its ranks exit because it closed their connections,
        // and rank 0 reports its own error (having called started()) rather than this watcher blaming them.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (starting) end_launch(c);
        break;
      }
    } else {
      for (Child& c : children)
        if (c.reaped && c.status != 0 && !c.reported) {
          log::warn("rank {} (pid {}) {}", c.rank, c.pid, describe_exit(c.status));
          c.reported = true;
        }
    }
    // Done when every child is reaped and its stderr drained; once told to stop, reaped is enough (something the
    // child started may hold its stderr open).
    bool all_reaped = true;
    for (const Child& c : children) all_reaped &= c.reaped;
    if (all_done || (stop && all_reaped)) return;
  }
}

LocalRanks::LocalRanks() : watch_(std::make_unique<Watch>()) {}

LocalRanks::LocalRanks(LocalRanks&& other) noexcept : watch_(std::move(other.watch_)) {}

void LocalRanks::started() {
  if (watch_) watch_->starting = false;
}

LocalRanks::~LocalRanks() {
  if (!watch_) return;
  if (watch_->thread.joinable()) set_group_broken_handler({});
  watch_->starting = false;
  if (!watch_->thread.joinable()) return;
  // The children exit when rank 0's model says stop (or its connections close); give them a moment, then end them.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    bool all = true;
    {
      std::lock_guard<std::mutex> lock(watch_->mu);
      for (const auto& c : watch_->children) all &= c.reaped;
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::lock_guard<std::mutex> lock(watch_->mu);
      for (const auto& c : watch_->children)
        if (!c.reaped) {
          log::warn("rank process {} did not exit after rank 0 stopped: killing it", c.pid);
          ::kill(c.pid, SIGKILL);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  watch_->stop = true;
  watch_->thread.join();
}

Result<LocalRanks> launch_local_ranks(const Recipe& recipe, const RankLaunchOptions& opts, int argc, char** argv) {
  LocalRanks ranks;
  const int world = static_cast<int>(recipe.section("parallel").get_int("tensor", 1));
  const std::string backend = recipe.section("transport").get_string("backend", "local");
  const bool processes = backend != "local";
  const bool flags = opts.nnodes != 1 || opts.node_rank != 0 || opts.nproc_per_node != 0 || !opts.master_addr.empty() ||
                     opts.master_port != 0;
  if (world <= 1 || !processes) {
    if (flags)
      return invalid_argument("--nnodes/--node-rank/--nproc-per-node/--master-addr/--master-port launch rank processes, "
                              "and this recipe runs " +
                              std::string(world <= 1 ? "one rank" : "its ranks as threads (transport.backend = \"local\")") +
                              "; set parallel.tensor > 1 and transport.backend = \"socket\"");
    return ranks;
  }
  if (std::getenv("RANK") || std::getenv("WORLD_SIZE")) {
    // A rank this launcher started re-runs the launcher's flags; only another launcher's ranks may not give them.
    if (flags && !std::getenv("KILN_LAUNCHED_RANK")) return invalid_argument("RANK/WORLD_SIZE are set (a launcher started this rank): give no launch flags");
    return ranks;  // torchrun-style: this process is the rank the environment names
  }
  if (opts.nnodes < 1) return invalid_argument("--nnodes must be at least 1");
  if (opts.node_rank < 0 || opts.node_rank >= opts.nnodes)
    return invalid_argument("--node-rank " + std::to_string(opts.node_rank) + " is not in 0.." +
                            std::to_string(opts.nnodes - 1));
  const int per_node = opts.nproc_per_node > 0 ? opts.nproc_per_node : world / opts.nnodes;
  if (per_node * opts.nnodes != world)
    return invalid_argument("parallel.tensor = " + std::to_string(world) + " ranks do not make " +
                            std::to_string(opts.nnodes) + " nodes of " + std::to_string(per_node) +
                            " processes (--nnodes × --nproc-per-node must equal parallel.tensor)");
  std::string addr = opts.master_addr;
  int port = opts.master_port;
  if (opts.nnodes > 1 && (addr.empty() || port == 0))
    return invalid_argument("--nnodes " + std::to_string(opts.nnodes) +
                            ": give --master-addr (node 0's address, reachable from every node) and --master-port");
  if (addr.empty()) addr = "127.0.0.1";
  if (port == 0) {
    // The collective, the control channel and one per decode-context group; rank 0 names a port it cannot listen on.
    const int64_t context = std::max<int64_t>(recipe.section("parallel").get_int("decode_context", 1), 1);
    KILN_ASSIGN_OR_RETURN(port, free_loopback_ports(2 + static_cast<int>(context > 1 ? world / context : 0)));
  }
  const int first = opts.node_rank * per_node;

  // The children's environment: this one's, with the rank variables replaced.
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    bool rank_var = false;
    for (const char* v : kRankVariables)
      if (std::strncmp(*e, v, std::strlen(v)) == 0 && (*e)[std::strlen(v)] == '=') rank_var = true;
    if (!rank_var) base.emplace_back(*e);
  }
  auto rank_env = [&](int rank, int local) {
    std::vector<std::string> env = base;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    env.push_back("MASTER_ADDR=" + addr);
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("KILN_LAUNCHED_RANK=1");
    return env;
  };
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  auto& children = ranks.watch_->children;
  auto abandon = [&](const std::string& why) {
    for (auto& c : children) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      if (c.err >= 0) ::close(c.err);
    }
    children.clear();
    return unavailable("starting rank process: " + why + ": " + std::strerror(errno));
  };
  for (int local = 1; local < per_node; ++local) {
    const std::vector<std::string> env = rank_env(first + local, local);
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    // Its stderr comes through a pipe, so that this process can say what it wrote last if it fails to start.
    int err[2];
    if (::pipe2(err, O_CLOEXEC) != 0) return abandon("pipe");
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(err[0]);
      ::close(err[1]);
      return abandon("fork");
    }
    if (pid == 0) {
      // Only async-signal-safe calls until exec. The child dies with this process, whatever ends it, and gets the
      // signals `kiln serve` blocks in its parent back.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(err[1], STDERR_FILENO);
      ::execve("/proc/self/exe", args.data(), envp.data());
      ::_exit(127);
    }
    ::close(err[1]);
    ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL, 0) | O_NONBLOCK);
    LocalRanks::Watch::Child child;
    child.pid = pid;
    child.rank = first + local;
    child.err = err[0];
    children.push_back(std::move(child));
  }
  if (!children.empty()) {
    ranks.watch_->thread = std::thread([w = ranks.watch_.get()] { w->run(); });
    set_group_broken_handler([w = ranks.watch_.get()](const Status& why) { w->stop_ranks(why); });
  }
  // This process is the node's first rank.
  for (const std::string& e : rank_env(first, 0)) {
    const size_t eq = e.find('=');
    const std::string name = e.substr(0, eq);
    bool rank_var = false;
    for (const char* v : kRankVariables) rank_var |= name == v;
    if (rank_var) ::setenv(name.c_str(), e.substr(eq + 1).c_str(), 1);
  }
  log::info("ranks as processes: this is rank {} of {}; started rank(s) {}..{} on this machine; meeting at {}:{}", first,
            world, first + 1, first + per_node - 1, addr, port);
  return ranks;
}

int run_follower_rank(LoadedModel& model) {
  const int rank = model.rank;
  // `kiln serve` blocked the shutdown signals for its rank 0; a follower has nothing to drain.
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  log::info("tensor-parallel rank {}: executing rank 0's calls", rank);
  Status s = run_rank_follower(*model.model, *model.rank_control, model.layout.get(),
                               socket_call_groups(model.collective.get(), model.context_collective.get()));
  if (!s.ok()) return fail("tensor-parallel rank " + std::to_string(rank) + ": " + s.message());
  log::info("tensor-parallel rank {}: rank 0 stopped; exiting", rank);
  return 0;
}

}  // namespace kiln::cli
