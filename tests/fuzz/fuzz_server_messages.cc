// Fuzzes the server's handling of a client's step stream up to the model: the input is a sequence
// of messages, each a 2-byte little-endian length and that many bytes. Every message that parses
// as a StepRequest (gRPC drops the others) goes to a StepAssembler, in order, as the Steps stream
// delivers it; each complete step's activation goes to the codec decoder of the client's stream
// and, for TRAIN steps, to an AQ-SGD receiver, with the server's shape check. Any amaq::Error is
// an accepted answer (the server ends that stream); a crash, a sanitizer report or another
// exception is a bug.
#include <cstddef>
#include <cstdint>

#include "amaq/v1/split_training.pb.h"
#include "common/base/error.h"
#include "quant/aqsgd.h"
#include "quant/codec.h"
#include "server/step_assembler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  amaq::server::StepLimits limits;
  limits.max_chunk_bytes = 4096;
  limits.max_chunks = 64;
  limits.max_step_bytes = 1 << 18;
  limits.shape.max_batch_tokens = 4096;
  limits.shape.max_sequence_tokens = 512;
  limits.shape.vocab_size = 300;
  amaq::quant::DecodeLimits decode_limits;
  decode_limits.max_elements = 1 << 20;
  amaq::server::StepAssembler assembler(limits);
  amaq::quant::Decoder decoder(decode_limits);
  amaq::quant::AqsgdReceiver aqsgd(amaq::quant::AqsgdOptions{}, decode_limits);
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t length = std::min<size_t>(data[pos] | (size_t{data[pos + 1]} << 8), size - pos - 2);
    pos += 2;
    amaq::v1::StepRequest request;
    const bool parsed = request.ParseFromArray(data + pos, static_cast<int>(length));
    pos += length;
    if (!parsed) continue;
    try {
      if (!assembler.Add(request)) continue;
      const amaq::StepInput in = assembler.Take();
      if (in.kind == amaq::StepKind::kTrain && !in.sample_ids.empty()) {
        aqsgd.Decode(in.activation.data(), in.activation.size(), in.tokens, 16, in.batch);
      } else {
        amaq::quant::Decoded d;
        decoder.Decode(in.activation.data(), in.activation.size(), &d, amaq::quant::ExpectedShape{in.batch * in.tokens, 16});
      }
    } catch (const amaq::Error&) {
    }
  }
  return 0;
}
