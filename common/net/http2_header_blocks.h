// Http2HeaderBlocks: the header blocks a client sends on one HTTP/2 connection (RFC 9113 section
// 4.3: a HEADERS frame and the CONTINUATION frames up to END_HEADERS), bounded before the server's
// HTTP/2 library buffers them (gRPC 1.51's HPACK buffering is unbounded: the CONTINUATION flood and
// HPACK expansion of docs/reliability.md). Each block may hold at most kMaxBlockBytes compressed
// bytes in at most kMaxBlockFrames frames, and decode to a header list of at most kMaxListBytes
// (RFC 9113 section 6.5.2's size: name, value and 32 bytes a field). Decoding is nghttp2's HPACK
// inflater (RFC 7541), which keeps the connection's dynamic table, so every block of the
// connection must pass through here, in order. Once a call returns false the connection is to be
// closed: the blocks after it are not decoded. One per connection; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct nghttp2_hd_inflater;

namespace amaq {

class Http2HeaderBlocks {
 public:
  static constexpr size_t kMaxBlockBytes = 16384;
  static constexpr int kMaxBlockFrames = 16;
  static constexpr size_t kMaxListBytes = 16384;

  Http2HeaderBlocks();  // throws amaq::Error (kResourceExhausted) when nghttp2 has no memory
  ~Http2HeaderBlocks();

  // A frame of the block begins (HEADERS: a new block; CONTINUATION: the block goes on). False: a
  // frame too many, or a CONTINUATION with no block open.
  bool BeginFrame(bool continuation);
  // The next bytes of the block's fragment (padding and priority fields left out); `last` marks the
  // end of the block (the end of a frame with END_HEADERS). False: over a bound, or not HPACK.
  bool Fragment(const uint8_t* bytes, size_t n, bool last);
  bool open() const { return open_; }  // a block has begun and not ended

 private:
  struct Free {
    void operator()(nghttp2_hd_inflater* inflater) const;
  };
  std::unique_ptr<nghttp2_hd_inflater, Free> inflater_;
  bool open_ = false;
  int frames_ = 0;
  size_t block_bytes_ = 0;
  size_t list_bytes_ = 0;
};

}  // namespace amaq
