// The codec's AVX-512 kernels against the portable ones: the same bytes from the encoder, the same
// reconstruction, the same decoded floats and the same codes from UnpackCodes, over shapes whose
// widths do not fill whole 16-, 32- or 64-code blocks, every bit layout, and each width 1..8.
// On a CPU without AVX-512 the comparisons are skipped (and say so).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/base/error.h"
#include "quant/bitpack.h"
#include "quant/codec.h"
#include "quant/isa.h"
#include "test_tensors.h"

namespace amaq::quant {
namespace {

// Runs fn under `isa` and restores the CPU's best afterwards.
template <typename Fn>
auto Under(Isa isa, Fn fn) {
  const Isa before = ActiveIsa();
  SetIsa(isa);
  auto result = fn();
  SetIsa(before);
  return result;
}

struct Result {
  std::vector<uint8_t> bytes;
  std::vector<float> reconstruction, decoded;
};

Result Roundtrip(const std::vector<float>& x, int64_t rows, int64_t cols, const BitsTable& bits,
                 const EncodeOptions& o) {
  Result r;
  r.reconstruction.resize(x.size());
  r.bytes = Encoder().Encode(x.data(), rows, cols, bits, o, r.reconstruction.data()).bytes;
  r.decoded = Decoder().Decode(r.bytes.data(), r.bytes.size()).values;
  return r;
}

BitsTable RandomTable(BitsLayout layout, int64_t rows, int64_t cols, int min_bits, std::mt19937& rng) {
  std::uniform_int_distribution<int> width(min_bits, 8);
  std::vector<uint8_t> w(static_cast<size_t>(layout == BitsLayout::kPerChannel ? cols : rows));
  for (auto& b : w) b = static_cast<uint8_t>(width(rng));
  return layout == BitsLayout::kPerChannel ? BitsTable::PerChannel(w) : BitsTable::PerToken(w);
}

class IsaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CpuSupports(Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512: only the portable path runs";
  }
};

TEST_F(IsaTest, EveryLayoutAndShapeGivesTheSameBytesAndFloats) {
  std::mt19937 rng(7);
  const int64_t shapes[][2] = {{1, 1}, {3, 15}, {5, 17}, {7, 31}, {4, 33}, {9, 63}, {2, 64},
                               {6, 65}, {3, 130}, {17, 257}, {64, 512}, {2, 1000}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1];
    const std::vector<float> x = testing::HeavyTailedTensor(rows, cols, static_cast<uint32_t>(rows * cols));
    struct Case {
      std::string name;
      BitsTable bits;
      EncodeOptions options;
    };
    std::vector<Case> cases;
    for (int b = 1; b <= 8; ++b) cases.push_back({"uniform " + std::to_string(b), BitsTable::Uniform(b), {}});
    EncodeOptions token;
    token.granularity = Granularity::kToken;
    cases.push_back({"per-channel mixed", RandomTable(BitsLayout::kPerChannel, rows, cols, 1, rng), {}});
    cases.push_back({"per-token mixed", RandomTable(BitsLayout::kPerToken, rows, cols, 1, rng), token});
    EncodeOptions symmetric;
    symmetric.scheme = Scheme::kSymmetric;
    cases.push_back({"symmetric per-channel", RandomTable(BitsLayout::kPerChannel, rows, cols, 2, rng), symmetric});
    EncodeOptions group;
    group.granularity = Granularity::kGroup;
    group.group_size = 16;
    cases.push_back({"group 16, 3 bits", BitsTable::Uniform(3), group});
    EncodeOptions tensor;
    tensor.granularity = Granularity::kTensor;
    cases.push_back({"per-tensor 5 bits", BitsTable::Uniform(5), tensor});
    EncodeOptions token_symmetric = token;
    token_symmetric.scheme = Scheme::kSymmetric;
    cases.push_back({"per-token symmetric 4 bits", BitsTable::Uniform(4), token_symmetric});
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
      const Result portable = Under(Isa::kPortable, [&] { return Roundtrip(x, rows, cols, c.bits, c.options); });
      const Result fast = Under(Isa::kAvx512, [&] { return Roundtrip(x, rows, cols, c.bits, c.options); });
      ASSERT_EQ(portable.bytes, fast.bytes);
      ASSERT_EQ(portable.reconstruction, fast.reconstruction);
      ASSERT_EQ(portable.decoded, fast.decoded);
      // Each path decodes what the other encoded, and the decoded floats are the reconstruction.
      ASSERT_EQ(fast.decoded, portable.reconstruction);
    }
  }
}

TEST_F(IsaTest, SixteenBitCastsGiveTheSameBytesAndRefuseTheSameOverflow) {
  // Random finite bit patterns (every exponent, so half's subnormals and ties are hit), scaled
  // into each format's range, in a length that leaves a tail after the last block of 16.
  std::mt19937 rng(3);
  for (Scheme scheme : {Scheme::kBFloat16, Scheme::kFloat16}) {
    SCOPED_TRACE(ToString(scheme));
    const float limit = scheme == Scheme::kFloat16 ? 65000.0f : 1e38f;
    std::vector<float> x(16 * 500 + 7);
    for (float& v : x) {
      uint32_t bits = static_cast<uint32_t>(rng());
      float f;
      std::memcpy(&f, &bits, 4);
      if (!std::isfinite(f) || std::fabs(f) > limit) f = std::ldexp(static_cast<float>(bits % 1000) - 500.0f, -static_cast<int>(bits % 40));
      v = f;
    }
    EncodeOptions o;
    o.scheme = scheme;
    const int64_t n = static_cast<int64_t>(x.size());
    const Result portable = Under(Isa::kPortable, [&] { return Roundtrip(x, 1, n, BitsTable::Uniform(8), o); });
    const Result fast = Under(Isa::kAvx512, [&] { return Roundtrip(x, 1, n, BitsTable::Uniform(8), o); });
    ASSERT_EQ(portable.bytes, fast.bytes);
    ASSERT_EQ(portable.reconstruction, fast.reconstruction);
    ASSERT_EQ(portable.decoded, fast.decoded);
    // A value beyond the range, inside a block of 16, is refused with its index on both paths.
    x[100] = scheme == Scheme::kFloat16 ? 70000.0f : 3.4e38f;
    for (Isa isa : {Isa::kPortable, Isa::kAvx512}) {
      const std::string message = Under(isa, [&] {
        try {
          Roundtrip(x, 1, n, BitsTable::Uniform(8), o);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      });
      EXPECT_NE(message.find("at element 100 "), std::string::npos) << ToString(isa) << ": " << message;
    }
  }
}

TEST_F(IsaTest, NonFiniteInputIsRefusedOnBothPaths) {
  // One bad value at a place no block boundary favours, for each granularity's range pass.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (Granularity g : {Granularity::kChannel, Granularity::kToken, Granularity::kTensor}) {
      std::vector<float> x = testing::GaussianTensor(9, 37, 5);
      x[4 * 37 + 21] = bad;
      EncodeOptions o;
      o.granularity = g;
      for (Isa isa : {Isa::kPortable, Isa::kAvx512}) {
        const bool refused = Under(isa, [&] {
          try {
            Encoder().Encode(x.data(), 9, 37, BitsTable::Uniform(4), o);
          } catch (const Error& e) {
            return e.code() == ErrorCode::kInvalidArgument;
          }
          return false;
        });
        EXPECT_TRUE(refused) << ToString(isa) << " " << ToString(g) << " " << bad;
      }
    }
  }
}

TEST_F(IsaTest, UnpackCodesAgreesOnRowsThatStartMidByte) {
  // Five rows at random widths 1..8: most rows start mid-byte, and the last chunk's window is
  // cut short by the end of the stream (a masked load).
  std::mt19937 rng(11);
  for (int64_t cols : {13, 32, 45, 96, 100}) {
    const int64_t rows = 5;
    const BitsTable bits = RandomTable(BitsLayout::kPerChannel, rows, cols, 1, rng);
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) {
      codes[static_cast<size_t>(i)] = static_cast<uint8_t>(rng() & ((1u << bits.BitsAt(0, i % cols)) - 1u));
    }
    std::vector<uint8_t> packed(bits.PackedBytes(rows, cols));
    PackCodes(codes.data(), rows, cols, bits, packed.data());
    const auto unpack = [&] {
      std::vector<uint8_t> out(codes.size());
      UnpackCodes(packed.data(), packed.size(), rows, cols, bits, out.data());
      return out;
    };
    EXPECT_EQ(Under(Isa::kAvx512, unpack), codes) << cols << " columns";
    EXPECT_EQ(Under(Isa::kPortable, unpack), codes) << cols << " columns";
  }
}

TEST_F(IsaTest, PackCodesAgreesOnLayoutsThatReachEachPackingKernel) {
  // Per-channel widths whose groups of eight are whole bytes (laid out by a byte permutation while
  // rows start on a byte); seven narrow codes and then only 8-bit ones (each later 64-code block
  // then ends eight stream words, and its last group spills into a ninth); and random widths. Rows of
  // odd widths start mid-byte and mid-word; the tails are shorter than a block.
  std::mt19937 rng(13);
  const uint8_t whole_bytes[8] = {3, 5, 4, 4, 2, 6, 7, 1};
  for (int64_t cols : {64, 128, 200, 517}) {
    std::vector<std::vector<uint8_t>> tables(3, std::vector<uint8_t>(static_cast<size_t>(cols)));
    for (int64_t c = 0; c < cols; ++c) {
      tables[0][static_cast<size_t>(c)] = whole_bytes[c % 8];
      tables[1][static_cast<size_t>(c)] = c < 7 ? 3 : 8;
      tables[2][static_cast<size_t>(c)] = static_cast<uint8_t>(1 + rng() % 8);
    }
    tables[0].back() = 5;  // an odd row width when cols % 8 == 1..7 leaves a partial group
    for (const auto& widths : tables) {
      const BitsTable bits = BitsTable::PerChannel(widths);
      for (int64_t rows : {1, 3, 8}) {
        std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
        for (int64_t i = 0; i < rows * cols; ++i) {
          codes[static_cast<size_t>(i)] = static_cast<uint8_t>(rng() & ((1u << widths[static_cast<size_t>(i % cols)]) - 1u));
        }
        const auto pack = [&] {
          std::vector<uint8_t> packed(bits.PackedBytes(rows, cols));
          PackCodes(codes.data(), rows, cols, bits, packed.data());
          return packed;
        };
        const std::vector<uint8_t> portable = Under(Isa::kPortable, pack);
        ASSERT_EQ(Under(Isa::kAvx512, pack), portable) << rows << " x " << cols << ", widths from " << int(widths[0]);
        std::vector<uint8_t> back(codes.size());
        UnpackCodes(portable.data(), portable.size(), rows, cols, bits, back.data());
        ASSERT_EQ(back, codes);
      }
    }
  }
}

TEST(Isa, SettingAnIsaTheCpuLacksIsRefused) {
  EXPECT_TRUE(CpuSupports(Isa::kPortable));
  if (CpuSupports(Isa::kAvx512)) {
    EXPECT_EQ(ActiveIsa(), Isa::kAvx512);  // the best is the default
    GTEST_SKIP() << "this CPU has AVX-512: nothing to refuse";
  }
  EXPECT_EQ(ActiveIsa(), Isa::kPortable);
  EXPECT_THROW(SetIsa(Isa::kAvx512), Error);
  EXPECT_EQ(ActiveIsa(), Isa::kPortable);
}

}  // namespace
}  // namespace amaq::quant
