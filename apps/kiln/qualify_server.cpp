#include "qualify_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace kiln::cli {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : "kiln";
}

}  // namespace

std::string ChildServer::start(const std::string& recipe, int port, const std::vector<std::string>& args,
                               const std::string& log_path, int timeout_s) {
  log_path_ = log_path;
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return "cannot write the server log " + log_path + ": " + std::strerror(errno);
  const std::string exe = self_exe();
  std::vector<std::string> argv_s = {"kiln", "serve", recipe, "--port", std::to_string(port)};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    close(log_fd);
    return std::string("fork failed: ") + std::strerror(errno);
  }
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
    signal(SIGPIPE, SIG_DFL);           // `kiln qualify` ignores it (below); the server gets the default it always has
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(log_fd);

  // `kiln serve` prints "listening on http://HOST:PORT" once it accepts connections.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  const std::regex listening("listening on http://([^:\\s]+):([0-9]+)");
  bool found = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!alive())
      return "`kiln serve " + recipe + "` " + exit_text_ + " before it listened; its log ends:\n" + log_tail(15);
    std::smatch m;
    const std::string log = read_file(log_path);
    if (std::regex_search(log, m, listening)) {
      address_.host = m[1];
      address_.port = std::stoi(m[2]);
      found = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!found) {
    stop(5);
    return "`kiln serve " + recipe + "` did not listen within " + std::to_string(timeout_s) + " s; its log ends:\n" +
           log_tail(15);
  }
  while (std::chrono::steady_clock::now() < deadline) {
    if (get_status(address_, "/health", 5) == 200) return "";
    if (!alive()) return "`kiln serve " + recipe + "` " + exit_text_ + "; its log ends:\n" + log_tail(15);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop(5);
  return "`kiln serve " + recipe + "` never answered GET /health with 200 within " + std::to_string(timeout_s) + " s";
}

void ChildServer::reaped(int status) {
  pid_ = -1;
  if (WIFEXITED(status))
    exit_text_ = "exited with status " + std::to_string(WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    exit_text_ = "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  else
    exit_text_ = "ended";
}

bool ChildServer::alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) reaped(status);
  return pid_ > 0;
}

std::string ChildServer::log_tail(int lines) const {
  std::istringstream in(read_file(log_path_));
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "  " + l + "\n";
  return out;
}

std::string ChildServer::log_line(const std::string& needle) const {
  std::istringstream in(read_file(log_path_));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(needle);
    if (at != std::string::npos) return line.substr(at);
  }
  return "";
}

std::string ChildServer::stop(int grace_s) {
  if (pid_ <= 0) return exit_text_;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!alive()) return exit_text_;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped(status);
  exit_text_ += " (killed after a " + std::to_string(grace_s) + " s drain)";
  return exit_text_;
}

}  // namespace kiln::cli
