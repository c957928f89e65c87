// Fuzzes the two parsers of untrusted bytes in quant/: the tensor codec's Decoder (twice on one
// stream, so that bits-table references are exercised) and the AQ-SGD frame receiver. Any
// amaq::Error is an accepted answer; a crash, a sanitizer report or another exception is a bug.
#include <cstddef>
#include <cstdint>

#include "common/base/error.h"
#include "quant/aqsgd.h"
#include "quant/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  amaq::quant::DecodeLimits limits;
  limits.max_elements = 1 << 20;
  amaq::quant::Decoder decoder(limits);
  for (int pass = 0; pass < 2; ++pass) {
    try {
      decoder.Decode(data, size);
    } catch (const amaq::Error&) {
    }
  }
  try {
    amaq::quant::AqsgdReceiver receiver(amaq::quant::AqsgdOptions{}, limits);
    receiver.Decode(data, size);
  } catch (const amaq::Error&) {
  }
  return 0;
}
