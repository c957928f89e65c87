#include "common/program.h"

#include <c10/util/Exception.h>
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
  } catch (const c10::Error& e) {
    spdlog::error("internal error in LibTorch: {} (please report it)", e.what_without_backtrace());
    return 1;
  }
}

}  // namespace amaq
