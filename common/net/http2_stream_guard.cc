#include "common/net/http2_stream_guard.h"

#include <algorithm>
#include <cstring>

namespace amaq {
namespace {

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";  // RFC 9113, section 3.4
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
constexpr uint8_t kHeaders = 0x1, kRstStream = 0x3;

}  // namespace

Http2StreamGuard::Http2StreamGuard(double per_second, double burst) : per_second_(per_second), burst_(burst), tokens_(burst) {}

bool Http2StreamGuard::Feed(const char* bytes, size_t n, Clock::time_point now) {
  while (n > 0 && !refused_) {
    size_t take = 0;
    if (preface_seen_ < kPrefaceBytes) {
      take = std::min(n, kPrefaceBytes - preface_seen_);
      refused_ = std::memcmp(bytes, kPreface + preface_seen_, take) != 0;
      preface_seen_ += take;
    } else if (payload_left_ > 0) {
      take = std::min<size_t>(n, payload_left_);
      payload_left_ -= static_cast<uint32_t>(take);
    } else {
      take = std::min(n, sizeof(header_) - header_seen_);
      std::memcpy(header_ + header_seen_, bytes, take);
      header_seen_ += take;
      if (header_seen_ == sizeof(header_)) {
        header_seen_ = 0;
        payload_left_ = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
        refused_ = !Frame(header_[3], now);
      }
    }
    bytes += take;
    n -= take;
  }
  return !refused_;
}

bool Http2StreamGuard::Frame(uint8_t type, Clock::time_point now) {
  if (type != kHeaders && type != kRstStream) return true;
  ++stream_frames_;
  if (refilled_ != Clock::time_point{}) {
    tokens_ = std::min(burst_, tokens_ + per_second_ * std::chrono::duration<double>(now - refilled_).count());
  }
  refilled_ = now;
  tokens_ -= 1;
  return tokens_ >= 0;
}

}  // namespace amaq
