// The error boundary of amaq's programs (docs/architecture.md, "Errors"): parses the settings,
// sets the log level, runs the program, and turns what escapes into a log line and an exit code:
// 0 done, 1 failed, 2 bad settings (amaq::Error kInvalidArgument).
#pragma once

#include <functional>

#include "common/config.h"

namespace amaq {

int RunProgram(Config& config, int argc, char** argv, const std::function<int(const Config&)>& run);

}  // namespace amaq
