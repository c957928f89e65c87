// Http2StreamGuard: watches what a client sends on one HTTP/2 connection and says when it must be
// closed, before the server's HTTP/2 library (gRPC 1.51) buffers what it sent:
// - streams opened or reset faster than a server should serve (the "rapid reset" attack: HEADERS
//   then RST_STREAM, over and over, each stream costing a queued call that no concurrency limit
//   counts): HEADERS and RST_STREAM frames draw from a token bucket of `burst` frames refilled at
//   `per_second`;
// - header blocks over Http2HeaderBlocks' bounds (the CONTINUATION flood, HPACK expansion), or
//   broken (a CONTINUATION out of place, another frame inside a block, a client's PUSH_PROMISE);
// - floods of any frame: every frame but a DATA frame of kFreeDataBytes or more draws from a second
//   bucket of kFrameBurst frames refilled at kFramesPerSecond (PING, SETTINGS, WINDOW_UPDATE, empty
//   DATA and unknown frames cost the server little each, but not nothing).
// It reads RFC 9113's framing: the 24-byte connection preface, then frames of a 9-byte header
// (24-bit payload length, type, flags, stream id) and a payload, of which it reads only header
// blocks. Feed returns false, for good, once a bound is passed or the bytes are not HTTP/2; the
// caller closes the connection. One guard per connection, fed its bytes in order; not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/net/http2_header_blocks.h"

namespace amaq {

class Http2StreamGuard {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kFreeDataBytes = 1024;
  static constexpr double kFrameBurst = 10000;
  static constexpr double kFramesPerSecond = 10000;

  // per_second > 0, burst >= 1.
  Http2StreamGuard(double per_second, double burst);

  // The next `n` bytes the client sent, received at `now`. False: close the connection.
  bool Feed(const char* bytes, size_t n, Clock::time_point now);

  uint64_t stream_frames() const { return stream_frames_; }  // HEADERS and RST_STREAM seen

 private:
  // A token bucket: `tokens` refilled at `rate` a second up to `burst` since `refilled`, less one.
  struct Bucket {
    double rate, burst, tokens;
    Clock::time_point refilled{};
    bool Take(Clock::time_point now);  // false: overdrawn
  };
  bool Frame(Clock::time_point now);                 // a frame's header is complete
  bool Payload(const uint8_t* bytes, size_t n);      // the next bytes of its payload
  bool EndFrame();                                   // its payload is complete

  Bucket streams_, frames_;
  Http2HeaderBlocks blocks_;
  size_t preface_seen_ = 0;
  uint8_t header_[9] = {};
  size_t header_seen_ = 0;
  uint8_t type_ = 0, flags_ = 0;
  uint32_t length_ = 0, payload_seen_ = 0;
  uint32_t prefix_ = 0, padding_ = 0;  // of a header block frame: bytes before and after its fragment
  uint64_t stream_frames_ = 0;
  bool refused_ = false;
};

}  // namespace amaq
