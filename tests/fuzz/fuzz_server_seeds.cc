// fuzz_server_seeds DIR: writes valid step streams (length-prefixed StepRequest messages, the
// input format of fuzz_server_messages) into DIR, one per file: single- and multi-chunk TRAIN,
// SCORE and AQ-SGD steps.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "amaq/v1/split_training.pb.h"
#include "quant/aqsgd.h"
#include "quant/codec.h"

using namespace amaq::quant;
using amaq::v1::StepRequest;

namespace {

// The chunks of one step of batch 2 x tokens 3 carrying `activation` (SCORE: two candidates
// scored at three positions, no labels).
std::string Stream(const std::vector<uint8_t>& activation, StepRequest::Kind kind, size_t chunk, bool sample_ids) {
  std::string out;
  const size_t count = (activation.size() + chunk - 1) / chunk;
  for (size_t i = 0; i < count; ++i) {
    StepRequest r;
    r.set_step_id(0);
    r.set_kind(kind);
    r.set_chunk_index(static_cast<int>(i));
    r.set_chunk_count(static_cast<int>(count));
    if (i == 0) {
      r.set_batch(2);
      r.set_tokens(3);
      for (int k = 0; k < 6; ++k) {
        r.add_attention_mask(1);
        if (kind != StepRequest::SCORE) r.add_labels(k % 2 ? 5 : -100);
      }
      if (kind == StepRequest::SCORE) {
        r.set_candidates(2);
        for (int k : {2, 2, 5}) r.add_target_positions(k);
        for (int k : {5, 6, 5}) r.add_target_tokens(k);
        for (int k : {0, 1, 1}) r.add_target_candidates(k);
      }
      if (sample_ids) {
        r.add_sample_ids(1);
        r.add_sample_ids(2);
      }
    }
    const size_t begin = i * chunk;
    r.set_payload(activation.data() + begin, std::min(chunk, activation.size() - begin));
    const std::string bytes = r.SerializeAsString();
    out += static_cast<char>(bytes.size() & 0xff);
    out += static_cast<char>(bytes.size() >> 8);
    out += bytes;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_server_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  const auto write = [&](const std::string& bytes) { std::ofstream(dir + "/seed-" + std::to_string(n++), std::ios::binary) << bytes; };
  std::vector<float> x(6 * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) - 4.5f;
  EncodeOptions bf16;
  bf16.scheme = Scheme::kBFloat16;
  const std::vector<uint8_t> plain = Encoder().Encode(x.data(), 6, 16, BitsTable{}, bf16).bytes;
  const std::vector<uint8_t> mixed = Encoder().Encode(x.data(), 6, 16, BitsTable::Uniform(3), EncodeOptions{}).bytes;
  AqsgdSender sender(AqsgdOptions{});
  const std::vector<uint8_t> delta = sender.Encode(x.data(), {1, 2}, 3, 16).bytes;
  write(Stream(plain, StepRequest::TRAIN, 4096, false));
  write(Stream(plain, StepRequest::TRAIN, 64, false));
  write(Stream(mixed, StepRequest::SCORE, 50, false));
  write(Stream(delta, StepRequest::TRAIN, 4096, true));
  write(Stream(delta, StepRequest::TRAIN, 40, true));
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
