#include "client/run_csv.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "client/split_client.h"
#include "common/base/error.h"

namespace amaq::client {
namespace {

// Now, in UTC, as 2026-12-07T02:40:26.123Z.
std::string UtcNow() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(millis));
  return text;
}

}  // namespace

RunCsv::RunCsv(const std::string& path) {
  std::string header, last;
  {
    std::ifstream in(path);
    std::getline(in, header);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) last = line;
    }
  }
  Require(header.empty() || header == kHeader, ErrorCode::kFailedPrecondition,
          path + " holds rows under another header (an older amaq's CSV, without the run or server column, or another file): "
                 "set csv to a new path, or move that file away");
  if (!last.empty()) {  // run is the second last column; server (host:port, no comma) the last
    const size_t server = last.rfind(',');
    const size_t run = server == std::string::npos || server == 0 ? std::string::npos : last.rfind(',', server - 1);
    if (run != std::string::npos) last_run_ = last.substr(run + 1, server - run - 1);
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  out_.open(path, std::ios::app);
  Require(out_.good(), ErrorCode::kFailedPrecondition,
          path + ": cannot write the run's CSV" + (ec ? " (" + ec.message() + ")" : "") +
              ": check that its folder is writable, or set csv to another path");
  if (header.empty()) out_ << kHeader << '\n' << std::flush;
}

void RunCsv::StartAt(int64_t first_step) { run_ = first_step > 0 && !last_run_.empty() ? last_run_ : UtcNow(); }

void RunCsv::Write(const std::string& client, const std::string& method, const std::string& server, const StepRecord& r) {
  if (run_.empty()) StartAt(0);
  out_ << client << ',' << method << ',' << r.step + 1 << ',' << r.wire_up << ',' << r.wire_down << ',' << r.up.payload
       << ',' << r.up.metadata << ',' << r.down.payload << ',' << r.down.metadata << ',' << r.loss << ','
       << r.average_bits << ',' << (r.metric ? std::to_string(*r.metric) : "") << ',' << r.seconds << ','
       << (r.applied ? 1 : 0) << ',' << run_ << ',' << server << '\n';
  out_.flush();
}

}  // namespace amaq::client
