// fuzz_codec_seeds DIR: writes valid codec messages and AQ-SGD frames into DIR, one per file.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "aqsgd_frames.h"
#include "quant/aqsgd.h"
#include "quant/checksum.h"
#include "quant/codec.h"

using namespace amaq::quant;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_codec_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  const auto write = [&](const std::vector<uint8_t>& bytes) {
    std::ofstream(dir + "/seed-" + std::to_string(n++), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  std::vector<float> x(6 * 10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) - 4.5f;
  for (Scheme s : {Scheme::kFloat32, Scheme::kBFloat16, Scheme::kFloat16}) {
    EncodeOptions o;
    o.scheme = s;
    write(Encoder().Encode(x.data(), 6, 10, BitsTable{}, o).bytes);
  }
  for (Granularity g : {Granularity::kTensor, Granularity::kChannel, Granularity::kToken, Granularity::kGroup}) {
    for (Scheme s : {Scheme::kAffine, Scheme::kSymmetric}) {
      EncodeOptions o;
      o.scheme = s;
      o.granularity = g;
      o.group_size = 4;
      o.zstd = (n % 2) == 0;
      write(Encoder().Encode(x.data(), 6, 10, BitsTable::Uniform(3), o).bytes);
    }
  }
  EncodeOptions per_channel;
  write(Encoder().Encode(x.data(), 6, 10, BitsTable::PerChannel({1, 2, 3, 4, 5, 6, 7, 8, 3, 3}), per_channel).bytes);
  EncodeOptions per_token;
  per_token.granularity = Granularity::kToken;
  write(Encoder().Encode(x.data(), 6, 10, BitsTable::PerToken({8, 7, 6, 5, 4, 3}), per_token).bytes);
  for (Scheme s : {Scheme::kFloat32, Scheme::kAffine}) {  // no rows: what an empty AQ-SGD part is
    EncodeOptions o;
    o.scheme = s;
    write(Encoder().Encode(x.data(), 0, 10, BitsTable::Uniform(4), o).bytes);
  }
  AqsgdSender sender(AqsgdOptions{});
  write(sender.Encode(x.data(), {1, 2, 3}, 2, 10).bytes);  // all full: an empty delta part
  write(sender.Encode(x.data(), {1, 2, 4}, 2, 10).bytes);  // both parts
  write(sender.Encode(x.data(), {1, 2, 3}, 2, 10).bytes);  // all deltas: an empty full part
  // Deltas on the fuzz target's primed entries: of their own shape, and of others (longer, wider,
  // the same size in another shape).
  const std::vector<uint8_t> prime = amaq::testing::FuzzPrimeFrame();
  const uint64_t primed = WireChecksum(prime.data(), prime.size());
  write(amaq::testing::DeltaFrameOn(primed, {1, 2}, 2, 10, x.data()));
  write(amaq::testing::DeltaFrameOn(primed, {1}, 4, 10, x.data()));
  write(amaq::testing::DeltaFrameOn(primed, {2}, 2, 15, x.data()));
  write(amaq::testing::DeltaFrameOn(primed, {3}, 1, 20, x.data()));
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
