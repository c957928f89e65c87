// Test helper: runs one of amaq's programs as a child process (stdout and stderr to a log file),
// so that tests can kill it with SIGKILL the way a crash or an OOM killer would.
#pragma once

#include <signal.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace amaq::testing {

class Process {
 public:
  Process(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  void Kill(int signal) { kill(pid_, signal); }
  int pid() const { return pid_; }
  // The exit code (128 + signal when killed).
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// A field of /proc/PID/status in MiB (VmRSS, VmHWM); 0 when absent.
inline double ProcStatusMiB(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

// The port a program wrote to `port_file` (its --port_file: the number and a newline), once the
// whole line is there, within `seconds`; 0 if it never was.
inline int WaitForPortFile(const std::string& port_file, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    std::stringstream text;
    text << std::ifstream(port_file).rdbuf();
    int port = 0;
    if (text.str().find('\n') != std::string::npos && text >> port && port > 0) return port;
    if (std::chrono::steady_clock::now() > until) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// CPU seconds (user + system) of each thread of process `pid` whose name starts with `prefix`
// ("relay-": the server's front door threads), by thread name, from /proc/PID/task.
inline std::map<std::string, double> ThreadCpuSeconds(int pid, const std::string& prefix) {
  std::map<std::string, double> seconds;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::string name, stat;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (name.rfind(prefix, 0) != 0) continue;
    std::getline(std::ifstream(task.path() / "stat"), stat);
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
    std::string skip;
    for (int i = 0; i < 11; ++i) fields >> skip;  // state .. cmajflt: fields 3-13
    double user = 0, system = 0;
    fields >> user >> system;
    seconds[name] += (user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return seconds;
}

// Each thread's share of a core between two ThreadCpuSeconds readings `seconds` apart, as
// "relay-0 95%, relay-1 3%".
inline std::string ThreadCpuShares(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                                   double seconds) {
  std::string shares;
  for (const auto& [name, s] : after) {
    const auto was = before.find(name);
    shares += (shares.empty() ? "" : ", ") + name + " " +
              std::to_string(static_cast<int>(std::lround(100 * (s - (was == before.end() ? 0 : was->second)) / seconds))) + "%";
  }
  return shares;
}

// Waits up to `seconds` for `done()`; returns whether it became true.
template <typename F>
bool WaitFor(F done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace amaq::testing
