// Test helper: a decompression bomb in amaq's tensor message format (docs/wire-format.md). A valid
// fp32 message header declaring rows x cols, whose payload is a zstd frame of RLE blocks of zeros
// that inflates to rows x cols x 4 bytes from 4 bytes per 128 KiB (1 GiB from 32 KiB), sealed
// with a correct checksum, so that only a shape check stops it.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/checksum.h"

namespace amaq::testing {

inline std::vector<uint8_t> ZstdBombMessage(uint64_t rows, uint64_t cols) {
  const uint64_t content = rows * cols * 4;
  std::vector<uint8_t> frame = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // magic; single segment, 8-byte content size
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<uint8_t>(content >> (8 * i)));
  constexpr uint64_t kBlock = 128 * 1024;
  for (uint64_t done = 0; done < content; done += kBlock) {
    const uint64_t size = content - done < kBlock ? content - done : kBlock;
    const uint32_t header = static_cast<uint32_t>(size << 3) | (1u << 1) | (done + size == content ? 1u : 0u);  // RLE
    for (int i = 0; i < 3; ++i) frame.push_back(static_cast<uint8_t>(header >> (8 * i)));
    frame.push_back(0);  // the repeated byte
  }
  std::vector<uint8_t> message(48 + frame.size() + 8, 0);  // header, payload, checksum
  std::memcpy(message.data(), "AMQT", 4);
  message[4] = 1;     // version
  message[9] = 1;     // flags: zstd payload; scheme 0 = fp32, per tensor, no bits table
  std::memcpy(message.data() + 16, &rows, 8);
  std::memcpy(message.data() + 24, &cols, 8);
  const uint64_t payload = frame.size();
  std::memcpy(message.data() + 40, &payload, 8);
  std::memcpy(message.data() + 48, frame.data(), frame.size());
  const uint64_t sum = quant::WireChecksum(message.data(), message.size() - 8);
  std::memcpy(message.data() + message.size() - 8, &sum, 8);
  return message;
}

}  // namespace amaq::testing
