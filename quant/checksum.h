// The checksum of amaq's wire messages: XXH3-64 (xxHash 0.8, seed 0), about 30 GB/s on one core,
// so that integrity checking stays a small fraction of encoding time. Third-party decoders have it
// in every language (Python: xxhash.xxh3_64_intdigest).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace amaq::quant {

inline uint64_t WireChecksum(const uint8_t* data, size_t size) {
  return static_cast<uint64_t>(XXH3_64bits(data, size));
}

}  // namespace amaq::quant
