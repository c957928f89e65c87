#include "common/base/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace amaq {
namespace {

std::string Duration(double seconds) {
  char buf[32];
  const auto s = static_cast<long>(seconds);
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  }
  return buf;
}

}  // namespace

Progress::Progress(std::string label, int64_t total, double log_every_seconds)
    : label_(std::move(label)), total_(total), log_every_(log_every_seconds), tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_log_(start_) {}

std::string Progress::Line(int64_t done, const std::string& fields) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t progressed = done - start_done_;
  const double eta = progressed > 0 ? elapsed / static_cast<double>(progressed) * static_cast<double>(total_ - done) : 0;
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::string bar = "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '.') + "]";
  return label_ + " " + bar + " " + std::to_string(done) + "/" + std::to_string(total_) + "  " + fields +
         "  elapsed " + Duration(elapsed) + "  eta " + Duration(eta);
}

void Progress::Update(int64_t done, const std::string& fields) {
  if (start_done_ < 0) {
    start_done_ = done;  // a resumed run's ETA counts from where it resumed
    start_ = std::chrono::steady_clock::now();
  }
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", Line(done, fields).c_str());
    std::fflush(stderr);
  } else if (std::chrono::duration<double>(now - last_log_).count() >= log_every_) {
    spdlog::info("{}", Line(done, fields));
    last_log_ = now;
  }
}

void Progress::Finish(const std::string& fields) {
  if (tty_) std::fprintf(stderr, "\n");
  spdlog::info("{}", Line(total_, fields));
}

}  // namespace amaq
