// Http2StreamGuard: watches what a client sends on one HTTP/2 connection and says when it opens or
// resets streams faster than a server should serve (the "rapid reset" attack: HEADERS then
// RST_STREAM, over and over, each stream costing the server a queued call that no concurrency
// limit counts, since a reset stream is no longer open).
//
// It reads RFC 9113's framing only: the 24-byte connection preface, then frames of a 9-byte header
// (24-bit payload length, type, flags, stream id) and a payload it skips. HEADERS and RST_STREAM
// frames draw from a token bucket of `burst` frames refilled at `per_second`; PRIORITY, DATA and
// the rest cost nothing. Feed returns false, for good, once the bucket is overdrawn or the bytes
// are not HTTP/2 (a wrong preface); the caller closes the connection. One guard per connection,
// fed its bytes in order; not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace amaq {

class Http2StreamGuard {
 public:
  using Clock = std::chrono::steady_clock;
  // per_second > 0, burst >= 1.
  Http2StreamGuard(double per_second, double burst);

  // The next `n` bytes the client sent, received at `now`. False: close the connection.
  bool Feed(const char* bytes, size_t n, Clock::time_point now);

  uint64_t stream_frames() const { return stream_frames_; }  // HEADERS and RST_STREAM seen

 private:
  bool Frame(uint8_t type, Clock::time_point now);  // a frame's header is complete

  double per_second_, burst_, tokens_;
  Clock::time_point refilled_{};
  size_t preface_seen_ = 0;
  uint8_t header_[9] = {};
  size_t header_seen_ = 0;
  uint32_t payload_left_ = 0;
  uint64_t stream_frames_ = 0;
  bool refused_ = false;
};

}  // namespace amaq
