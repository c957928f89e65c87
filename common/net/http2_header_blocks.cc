#include "common/net/http2_header_blocks.h"

#include <nghttp2/nghttp2.h>

#include "common/base/error.h"

namespace amaq {

void Http2HeaderBlocks::Free::operator()(nghttp2_hd_inflater* inflater) const { nghttp2_hd_inflate_del(inflater); }

Http2HeaderBlocks::Http2HeaderBlocks() {
  nghttp2_hd_inflater* inflater = nullptr;
  Require(nghttp2_hd_inflate_new(&inflater) == 0, ErrorCode::kResourceExhausted,
          "nghttp2 cannot make an HPACK decoder (out of memory): lower max_connections");
  inflater_.reset(inflater);
}

Http2HeaderBlocks::~Http2HeaderBlocks() = default;

bool Http2HeaderBlocks::BeginFrame(bool continuation) {
  if (continuation != open_) return false;  // a CONTINUATION needs an open block, a HEADERS none
  if (!open_) {
    open_ = true;
    frames_ = 0;
    block_bytes_ = 0;
    list_bytes_ = 0;
  }
  return ++frames_ <= kMaxBlockFrames;
}

bool Http2HeaderBlocks::Fragment(const uint8_t* bytes, size_t n, bool last) {
  block_bytes_ += n;
  if (!open_ || block_bytes_ > kMaxBlockBytes) return false;
  while (true) {
    nghttp2_nv field;
    int flags = 0;
    const ssize_t used = nghttp2_hd_inflate_hd2(inflater_.get(), &field, &flags, bytes, n, last ? 1 : 0);
    if (used < 0) return false;  // not HPACK, or a field nghttp2 will not hold
    bytes += used;
    n -= static_cast<size_t>(used);
    if (flags & NGHTTP2_HD_INFLATE_EMIT) {
      list_bytes_ += field.namelen + field.valuelen + 32;
      if (list_bytes_ > kMaxListBytes) return false;
    }
    if (flags & NGHTTP2_HD_INFLATE_FINAL) {
      nghttp2_hd_inflate_end_headers(inflater_.get());
      open_ = false;
      return true;
    }
    if (!(flags & NGHTTP2_HD_INFLATE_EMIT) && n == 0) return true;  // the rest comes in later bytes
  }
}

}  // namespace amaq
