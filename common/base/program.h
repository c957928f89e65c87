// The error boundary of amaq's programs (docs/architecture.md, "Errors"): parses the settings,
// sets the log level, runs the program, and turns what escapes into a log line and an exit code:
// 0 done, 1 failed, 2 bad settings (amaq::Error kInvalidArgument). With --check_config the
// program only validates its settings (check) and exits: 0 valid, 2 not; with --version it
// prints the commit it was built from and exits 0.
#pragma once

#include <cstdint>
#include <functional>

#include "common/base/config.h"

namespace amaq {

// The keys every program has: log_level and check_config. Call from the program's Config().
void AddProgramKeys(Config& config);

// The commit this build comes from (40 hex digits; "unknown" outside a git checkout), and whether
// tracked files differed from it when it was built (cmake/build_stamp.cmake).
const char* BuildCommit();
bool BuildDirty();

// `check` validates what the program derives from its settings (option ranges, method names,
// addresses) without opening a file, a socket or the model, so that a deployment's arguments can
// be checked where its paths do not exist (tests/deploy_test.py). It throws amaq::Error.
int RunProgram(Config& config, int argc, char** argv, const std::function<int(const Config&)>& run,
               const std::function<void(const Config&)>& check);

// SIGINT and SIGTERM stop the long-running programs (amaq-server, amaq-client, amaq-netem) cleanly.
// BlockStopSignals() blocks them in the calling thread: call it first in main, so that every
// thread started later inherits the mask and the signals wait for WaitForStopSignal, which returns
// the signal, or 0 when `seconds` (> 0) passed first.
void BlockStopSignals();
int WaitForStopSignal(double seconds = 0);

// Raises this process's open-files limit (RLIMIT_NOFILE) to its hard limit, so that a server
// holds as many connections as the system allows; returns the limit now in force.
uint64_t RaiseOpenFilesLimit();

}  // namespace amaq
