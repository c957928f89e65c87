// Http2StreamGuard against frames written here from RFC 9113 (section 4.1: a 24-bit length, type,
// flags, a 31-bit stream id, then the payload).
#include "common/net/http2_stream_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace amaq {
namespace {

using Clock = Http2StreamGuard::Clock;

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

std::string Frame(uint8_t type, uint32_t stream, const std::string& payload) {
  std::string frame = {static_cast<char>(payload.size() >> 16), static_cast<char>(payload.size() >> 8),
                       static_cast<char>(payload.size()), static_cast<char>(type), 0};
  for (int shift = 24; shift >= 0; shift -= 8) frame += static_cast<char>(stream >> shift);
  return frame + payload;
}
std::string Headers(uint32_t stream) { return Frame(0x1, stream, "\x83\x87"); }
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

TEST(Http2StreamGuard, BytesThatAreNotHttp2AreRefused) {
  Http2StreamGuard guard(100, 100);
  EXPECT_FALSE(Feed(guard, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", Clock::now()));
}

}  // namespace
}  // namespace amaq
