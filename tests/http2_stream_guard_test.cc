// Http2StreamGuard against frames written here from RFC 9113 (section 4.1: a 24-bit length, type,
// flags, a 31-bit stream id, then the payload) and header blocks from RFC 7541 (HPACK).
#include "common/net/http2_stream_guard.h"

#include "common/net/http2_header_blocks.h"
#include "http2_frames.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace amaq {
namespace {

using Clock = Http2StreamGuard::Clock;

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

using testing::kEndHeaders;
using testing::kPadded;
using testing::kPriority;

std::string Frame(uint8_t type, uint32_t stream, const std::string& payload, uint8_t flags = 0) {
  return testing::Http2Frame(type, flags, stream, payload);
}
// A whole header block (RFC 7541: :method POST, :scheme https, two indexed fields).
std::string Headers(uint32_t stream) { return Frame(0x1, stream, "\x83\x87", kEndHeaders); }
std::string Continuation(uint32_t stream, const std::string& fragment, uint8_t flags = 0) {
  return Frame(0x9, stream, fragment, flags);
}
// RFC 7541 section 6.2.1: a literal field with incremental indexing (it enters the dynamic table,
// index 62) and a new name "x" whose value is `value_bytes` bytes, its length an integer of a 7-bit
// prefix (section 5.1); the value itself follows.
std::string IndexedLiteralHead(size_t value_bytes) {
  std::string head = "\x40\x01x";
  if (value_bytes < 127) return head + static_cast<char>(value_bytes);
  head += '\x7f';
  for (value_bytes -= 127; value_bytes >= 128; value_bytes /= 128) head += static_cast<char>(0x80 | (value_bytes % 128));
  return head + static_cast<char>(value_bytes);
}
std::string Reset(uint32_t stream) { return Frame(0x3, stream, std::string("\0\0\0\x08", 4)); }

bool Feed(Http2StreamGuard& guard, const std::string& bytes, Clock::time_point at) {
  return guard.Feed(bytes.data(), bytes.size(), at);
}

TEST(Http2StreamGuard, ABurstOfStreamFramesPassesAndOneMoreClosesTheConnection) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(1, 4);
  ASSERT_TRUE(Feed(guard, kPreface + Frame(0x4, 0, ""), t0));  // SETTINGS costs nothing
  EXPECT_TRUE(Feed(guard, Headers(1) + Reset(1) + Headers(3) + Reset(3), t0));
  // A DATA frame whose payload looks like HEADERS frames is skipped whole, not parsed.
  std::string lookalike;
  for (int i = 0; i < 100; ++i) lookalike += Headers(5);
  EXPECT_TRUE(Feed(guard, Frame(0x0, 5, lookalike), t0));
  EXPECT_EQ(guard.stream_frames(), 4u);
  EXPECT_FALSE(Feed(guard, Headers(7), t0)) << "the fifth stream frame at once overdraws a burst of 4";
  EXPECT_FALSE(Feed(guard, Frame(0x4, 0, ""), t0 + std::chrono::hours(1))) << "refused for good";
}

TEST(Http2StreamGuard, TheBucketRefillsAtItsRateAndFramesMayArriveByteByByte) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(10, 2);
  const std::string bytes = kPreface + Headers(1) + Headers(3);
  for (char byte : bytes) ASSERT_TRUE(guard.Feed(&byte, 1, t0));
  EXPECT_EQ(guard.stream_frames(), 2u);
  EXPECT_TRUE(Feed(guard, Headers(5), t0 + std::chrono::milliseconds(110))) << "one token back after 0.1 s";
  EXPECT_FALSE(Feed(guard, Headers(7), t0 + std::chrono::milliseconds(120)));
}

// Issue 58 item 1: a header block may span frames, with padding and priority fields, and decodes
// across them; its bounds close the connection: compressed bytes (the CONTINUATION flood: 100,000
// frames of 16 KB held 1.9 GB of the server's memory), frames, and the decoded list (HPACK
// expansion: one 4 KB field referenced again and again).
TEST(Http2StreamGuard, AHeaderBlockSpansFramesWithinItsBounds) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(100, 100);
  const std::string padded = std::string("\x02") + std::string("\0\0\0\0\x10", 5) + "\x83" + std::string(2, '\0');
  ASSERT_TRUE(Feed(guard, kPreface + Frame(0x1, 1, padded, kPadded | kPriority), t0));
  EXPECT_TRUE(Feed(guard, Continuation(1, "\x87\x84"), t0));
  EXPECT_TRUE(Feed(guard, Continuation(1, "\x86", kEndHeaders) + Headers(3), t0)) << "the block ends: another begins";
  EXPECT_TRUE(Feed(guard, Frame(0x0, 3, "data") + Frame(0x6, 0, std::string(8, '\0')), t0));
}

TEST(Http2StreamGuard, AContinuationFloodIsClosedAtTheBlocksByteBound) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(100, 100);
  ASSERT_TRUE(Feed(guard, kPreface + Frame(0x1, 1, IndexedLiteralHead(60000)), t0));  // a 60 KB value follows
  size_t sent = 0;
  while (sent <= Http2HeaderBlocks::kMaxBlockBytes && Feed(guard, Continuation(1, std::string(4096, 'a')), t0)) sent += 4096;
  EXPECT_EQ(sent, 12288u) << "the fourth 4 KiB frame passes kMaxBlockBytes";
  EXPECT_FALSE(Feed(guard, Frame(0x4, 0, ""), t0)) << "refused for good";
}

TEST(Http2StreamGuard, AHeaderBlockOfTooManyFramesIsClosed) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(100, 100);
  ASSERT_TRUE(Feed(guard, kPreface + Frame(0x1, 1, IndexedLiteralHead(1000)), t0));
  int frames = 1;
  while (frames <= Http2HeaderBlocks::kMaxBlockFrames && Feed(guard, Continuation(1, "a"), t0)) ++frames;
  EXPECT_EQ(frames, Http2HeaderBlocks::kMaxBlockFrames);
}

TEST(Http2StreamGuard, HpackExpansionIsClosedAtTheDecodedListsBound) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(100, 100);
  const std::string field = IndexedLiteralHead(4000) + std::string(4000, 'a');  // decodes to 1 + 4000 + 32 bytes
  ASSERT_TRUE(Feed(guard, kPreface + Frame(0x1, 1, field, kEndHeaders), t0)) << "one 4 KB field fits";
  EXPECT_TRUE(Feed(guard, Frame(0x1, 3, "\xbe\xbe\xbe", kEndHeaders), t0)) << "three references (12 KB) fit";
  EXPECT_FALSE(Feed(guard, Frame(0x1, 5, "\xbe\xbe\xbe\xbe\xbe", kEndHeaders), t0))
      << "five references of one byte each decode to 20 KB";
}

TEST(Http2StreamGuard, BrokenHeaderBlocksAreClosed) {
  const Clock::time_point t0 = Clock::now();
  const auto refused = [&](const std::string& frames) {
    Http2StreamGuard guard(100, 100);
    return !Feed(guard, kPreface + frames, t0);
  };
  EXPECT_TRUE(refused(Continuation(1, "\x83", kEndHeaders))) << "a CONTINUATION without HEADERS";
  EXPECT_TRUE(refused(Frame(0x1, 1, "\x83") + Frame(0x0, 1, "data"))) << "DATA inside a header block";
  EXPECT_TRUE(refused(Frame(0x5, 1, std::string(4, '\0') + "\x83", kEndHeaders))) << "PUSH_PROMISE from a client";
  EXPECT_TRUE(refused(Frame(0x1, 1, "\x09\x83", kEndHeaders | kPadded))) << "more padding than payload";
  EXPECT_TRUE(refused(Frame(0x1, 1, "\xff\xff\xff\xff\x0f", kEndHeaders))) << "an index no table holds";
  EXPECT_FALSE(refused(Frame(0x1, 1, "\x83") + Continuation(1, "\x87", kEndHeaders)));
}

// Every frame costs something: 10,000 PINGs at once pass, one more closes the connection; DATA
// frames of 1 KiB or more (flow control bounds them) are free.
TEST(Http2StreamGuard, AFloodOfAnyFrameIsClosed) {
  const Clock::time_point t0 = Clock::now();
  Http2StreamGuard guard(100, 100);
  ASSERT_TRUE(Feed(guard, kPreface + Headers(1), t0));
  std::string data;
  for (int i = 0; i < 20000; ++i) data += Frame(0x0, 1, std::string(Http2StreamGuard::kFreeDataBytes, 'd'));
  EXPECT_TRUE(Feed(guard, data, t0));
  std::string pings;
  for (int i = 1; i < static_cast<int>(Http2StreamGuard::kFrameBurst); ++i) pings += Frame(0x6, 0, std::string(8, '\0'));
  EXPECT_TRUE(Feed(guard, pings, t0)) << "the HEADERS and 9,999 PINGs: the burst";
  EXPECT_FALSE(Feed(guard, Frame(0x6, 0, std::string(8, '\0')), t0));
}

TEST(Http2StreamGuard, BytesThatAreNotHttp2AreRefused) {
  Http2StreamGuard guard(100, 100);
  EXPECT_FALSE(Feed(guard, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", Clock::now()));
}

}  // namespace
}  // namespace amaq
