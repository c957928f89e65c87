#include "common/base/program.h"

#include <signal.h>
#include <sys/resource.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <ctime>

#include "build_stamp.h"
#include "common/base/error.h"

namespace amaq {

void AddProgramKeys(Config& config) {
  config.AddString("log_level", "info", "spdlog level", {"trace", "debug", "info", "warn", "error"});
  config.AddBool("check_config", false,
                 "validate the settings (ranges, method, addresses; no file but --config is opened) and exit: 0 valid, 2 not");
}

const char* BuildCommit() { return AMAQ_BUILD_COMMIT; }
bool BuildDirty() { return AMAQ_BUILD_DIRTY; }

int RunProgram(Config& config, int argc, char** argv, const std::function<int(const Config&)>& run,
               const std::function<void(const Config&)>& check) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--version") {
      std::printf("%s built from commit %s%s\n", std::filesystem::path(argv[0]).filename().c_str(), BuildCommit(),
                  BuildDirty() ? " with local changes" : "");
      return 0;
    }
  }
  try {
    if (!config.Parse(argc, argv)) return 0;
    spdlog::set_level(spdlog::level::from_str(config.String("log_level")));
    // A program's quiet key (amaq-generate's) keeps its log to warnings and errors.
    if (config.Has("quiet") && config.Bool("quiet") && spdlog::get_level() < spdlog::level::warn) {
      spdlog::set_level(spdlog::level::warn);
    }
    if (config.Bool("check_config")) {
      check(config);
      std::printf("%s: the configuration is valid\n", std::filesystem::path(argv[0]).filename().c_str());
      return 0;
    }
    spdlog::info("configuration:\n{}", config.Dump());  // what this run used, in its log
    return run(config);
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    // LibTorch's errors append a backtrace after the first line: the first line says what failed.
    const std::string what = e.what();
    spdlog::error("internal error: {} (please report it)", what.substr(0, what.find('\n')));
    return 1;
  }
}

namespace {

sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

}  // namespace

void BlockStopSignals() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForStopSignal(double seconds) {
  const sigset_t signals = StopSignals();
  while (true) {
    int received = 0;
    if (seconds <= 0) {
      if (sigwait(&signals, &received) == 0) return received;
      continue;
    }
    timespec wait{};
    wait.tv_sec = static_cast<time_t>(seconds);
    wait.tv_nsec = static_cast<long>(std::fmod(seconds, 1.0) * 1e9);
    received = sigtimedwait(&signals, nullptr, &wait);
    if (received > 0) return received;
    if (errno == EAGAIN) return 0;  // the time passed; EINTR: wait again
  }
}

uint64_t RaiseOpenFilesLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

}  // namespace amaq
