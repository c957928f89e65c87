// HTTP/2 as a client writes it, from the RFCs rather than from a library (the tests and benchmarks
// of the front door's guard use it to send what a well-behaved client never would): a frame (RFC
// 9113 section 4.1: 24-bit length, type, flags, 31-bit stream id, payload) and the header block of
// a gRPC call (RFC 7541: indexed fields and literals without indexing, values under 127 bytes, no
// Huffman coding).
#pragma once

#include <cstdint>
#include <string>

namespace amaq::testing {

inline constexpr uint8_t kEndHeaders = 0x4, kPadded = 0x8, kPriority = 0x20;

inline std::string Http2Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string frame = {static_cast<char>(payload.size() >> 16), static_cast<char>(payload.size() >> 8),
                       static_cast<char>(payload.size()), static_cast<char>(type), static_cast<char>(flags)};
  for (int shift = 24; shift >= 0; shift -= 8) frame += static_cast<char>(stream >> shift);
  return frame + payload;
}

// The connection preface and an empty SETTINGS frame.
inline std::string Http2Preface() { return std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + Http2Frame(0x4, 0, 0, ""); }

// A Steps call to `authority` with `token` as its bearer (and, when given, a user agent).
inline std::string StepsCallHeaders(const std::string& authority = "localhost", const std::string& token = "not-a-token",
                                    const std::string& user_agent = "") {
  const auto literal = [](const std::string& name_index, const std::string& value) {
    return name_index + static_cast<char>(value.size()) + value;
  };
  std::string block = std::string("\x83\x87") +  // :method POST, :scheme https
                      literal("\x04", "/amaq.v1.SplitTraining/Steps") + literal("\x01", authority) +
                      literal("\x0f\x10", "application/grpc") + literal("\x0f\x08", "Bearer " + token) +
                      literal(std::string("\x00\x02te", 4), "trailers");
  if (!user_agent.empty()) block += literal(std::string("\x00\x0auser-agent", 12), user_agent);
  return block;
}

}  // namespace amaq::testing
