#include "common/program.h"

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace amaq {

int RunProgram(Config& config, int argc, char** argv, const std::function<int(const Config&)>& run) {
  try {
    if (!config.Parse(argc, argv)) return 0;
    spdlog::set_level(spdlog::level::from_str(config.String("log_level")));
    spdlog::debug("configuration:\n{}", config.Dump());
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

}  // namespace amaq
