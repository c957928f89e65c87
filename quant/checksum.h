// The checksum of amaq's wire messages: XXH3-64 (xxHash 0.8, seed 0), about 30 GB/s on one core,
// so that integrity checking stays a small fraction of encoding time. Third-party decoders have it
// in every language (Python: xxhash.xxh3_64_intdigest).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace amaq::quant {

inline uint64_t WireChecksum(const uint8_t* data, size_t size) {
  return static_cast<uint64_t>(XXH3_64bits(data, size));
}

// WireChecksum of bytes that come in pieces (a file written or read as a stream).
class WireChecksumStream {
 public:
  WireChecksumStream() : state_(XXH3_createState(), XXH3_freeState) { XXH3_64bits_reset(state_.get()); }
  void Update(const void* data, size_t size) { XXH3_64bits_update(state_.get(), data, size); }
  uint64_t Digest() const { return static_cast<uint64_t>(XXH3_64bits_digest(state_.get())); }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

}  // namespace amaq::quant
