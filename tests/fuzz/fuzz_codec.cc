// Fuzzes the two parsers of untrusted bytes in quant/: the tensor codec's Decoder (twice on one
// stream, so that bits-table references are exercised) and the AQ-SGD frame receiver. Any
// amaq::Error is an accepted answer; a crash, a sanitizer report or another exception is a bug.
// One AQ-SGD receiver lives across inputs (made anew every 1,000), primed with FuzzPrimeFrame's
// entries, whose tag the seeds' deltas name: deltas on held entries, of their shape or another,
// and frames decoded again are reached, not only first visits.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "aqsgd_frames.h"
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
  static std::unique_ptr<amaq::quant::AqsgdReceiver> receiver;
  static int inputs = 0;
  if (inputs++ % 1000 == 0) {
    receiver = std::make_unique<amaq::quant::AqsgdReceiver>(amaq::quant::AqsgdOptions{}, limits);
    const std::vector<uint8_t> prime = amaq::testing::FuzzPrimeFrame();
    receiver->Decode(prime.data(), prime.size());
  }
  try {
    receiver->Decode(data, size);
  } catch (const amaq::Error&) {
  }
  return 0;
}
