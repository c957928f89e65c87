#include "common/net/http2_stream_guard.h"

#include <algorithm>
#include <cstring>

namespace amaq {
namespace {

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";  // RFC 9113, section 3.4
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
// Frame types and flags (RFC 9113, section 6).
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3, kPushPromise = 0x5, kContinuation = 0x9;
constexpr uint8_t kEndHeaders = 0x4, kPadded = 0x8, kPriority = 0x20;

}  // namespace

bool Http2StreamGuard::Bucket::Take(Clock::time_point now) {
  if (refilled != Clock::time_point{}) tokens = std::min(burst, tokens + rate * std::chrono::duration<double>(now - refilled).count());
  refilled = now;
  tokens -= 1;
  return tokens >= 0;
}

Http2StreamGuard::Http2StreamGuard(double per_second, double burst)
    : streams_{per_second, burst, burst}, frames_{kFramesPerSecond, kFrameBurst, kFrameBurst} {}

bool Http2StreamGuard::Feed(const char* bytes, size_t n, Clock::time_point now) {
  while (n > 0 && !refused_) {
    size_t take = 0;
    if (preface_seen_ < kPrefaceBytes) {
      take = std::min(n, kPrefaceBytes - preface_seen_);
      refused_ = std::memcmp(bytes, kPreface + preface_seen_, take) != 0;
      preface_seen_ += take;
    } else if (payload_seen_ < length_) {
      take = std::min<size_t>(n, length_ - payload_seen_);
      refused_ = !Payload(reinterpret_cast<const uint8_t*>(bytes), take) || (payload_seen_ == length_ && !EndFrame());
    } else {
      take = std::min(n, sizeof(header_) - header_seen_);
      std::memcpy(header_ + header_seen_, bytes, take);
      header_seen_ += take;
      if (header_seen_ == sizeof(header_)) {
        header_seen_ = 0;
        refused_ = !Frame(now) || (length_ == 0 && !EndFrame());
      }
    }
    bytes += take;
    n -= take;
  }
  return !refused_;
}

bool Http2StreamGuard::Frame(Clock::time_point now) {
  length_ = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
  type_ = header_[3];
  flags_ = header_[4];
  payload_seen_ = 0;
  if (!(type_ == kData && length_ >= kFreeDataBytes) && !frames_.Take(now)) return false;
  if (type_ == kHeaders || type_ == kRstStream) {
    ++stream_frames_;
    if (!streams_.Take(now)) return false;
  }
  if (type_ == kPushPromise) return false;  // only a server may send one
  if (type_ != kHeaders && type_ != kContinuation) return !blocks_.open();  // nothing may come inside a block
  if (!blocks_.BeginFrame(type_ == kContinuation)) return false;
  prefix_ = type_ == kHeaders ? ((flags_ & kPadded) ? 1 : 0) + ((flags_ & kPriority) ? 5 : 0) : 0;
  padding_ = 0;
  return prefix_ <= length_;
}

bool Http2StreamGuard::Payload(const uint8_t* bytes, size_t n) {
  const uint32_t begin = payload_seen_;
  payload_seen_ += static_cast<uint32_t>(n);
  if (type_ != kHeaders && type_ != kContinuation) return true;  // skipped, not read
  if (begin == 0 && type_ == kHeaders && (flags_ & kPadded)) {
    padding_ = bytes[0];
    if (prefix_ + padding_ > length_) return false;
  }
  // The part of [begin, payload_seen_) that lies in the fragment [prefix_, length_ - padding_).
  const uint32_t from = std::max(begin, prefix_), to = std::min(payload_seen_, length_ - padding_);
  return from >= to || blocks_.Fragment(bytes + (from - begin), to - from, false);
}

bool Http2StreamGuard::EndFrame() {
  if ((type_ != kHeaders && type_ != kContinuation) || !(flags_ & kEndHeaders)) return true;
  static constexpr uint8_t kNothing = 0;
  return blocks_.Fragment(&kNothing, 0, true);
}

}  // namespace amaq
