#include "quant/bitpack.h"

#include <gtest/gtest.h>

#include <random>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

std::vector<uint8_t> RandomCodes(int64_t rows, int64_t cols, const BitsTable& bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      codes[r * cols + c] = static_cast<uint8_t>(rng() & ((1u << bits.BitsAt(r, c)) - 1));
    }
  }
  return codes;
}

void ExpectRoundTrip(int64_t rows, int64_t cols, const BitsTable& bits, uint32_t seed) {
  const auto codes = RandomCodes(rows, cols, bits, seed);
  // Guard bytes after the packed region catch any write past its end.
  const size_t size = bits.PackedBytes(rows, cols);
  std::vector<uint8_t> packed(size + 16, 0xAB);
  PackCodes(codes.data(), rows, cols, bits, packed.data());
  for (size_t i = size; i < packed.size(); ++i) ASSERT_EQ(packed[i], 0xAB) << "wrote past the end";
  std::vector<uint8_t> back(codes.size());
  UnpackCodes(packed.data(), size, rows, cols, bits, back.data());
  EXPECT_EQ(back, codes);
}

TEST(BitPack, EveryUniformWidthAndOddSizes) {
  for (int b = 1; b <= 8; ++b) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 13}, {17, 33}, {2, 64}}) {
      SCOPED_TRACE(testing::Message() << "bits " << b << " shape " << rows << "x" << cols);
      ExpectRoundTrip(rows, cols, BitsTable::Uniform(b), static_cast<uint32_t>(b * 100 + cols));
      EXPECT_EQ(BitsTable::Uniform(b).PackedBytes(rows, cols),
                static_cast<uint64_t>((rows * cols * b + 7) / 8));
    }
  }
}

TEST(BitPack, MixedPerChannelAndPerTokenWidths) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t rows = 1 + rng() % 20, cols = 1 + rng() % 40;
    std::vector<uint8_t> per_channel(cols), per_token(rows);
    for (auto& b : per_channel) b = static_cast<uint8_t>(1 + rng() % 8);
    for (auto& b : per_token) b = static_cast<uint8_t>(1 + rng() % 8);
    ExpectRoundTrip(rows, cols, BitsTable::PerChannel(per_channel), rng());
    ExpectRoundTrip(rows, cols, BitsTable::PerToken(per_token), rng());
  }
}

TEST(BitPack, DenseWithoutPadding) {
  // Three 3-bit codes 0b101, 0b011, 0b111 -> stream bits 101 110 111 (LSB first) = byte 0xDD, 0x01.
  const std::vector<uint8_t> codes = {5, 3, 7};
  std::vector<uint8_t> packed(2);
  PackCodes(codes.data(), 1, 3, BitsTable::Uniform(3), packed.data());
  EXPECT_EQ(packed[0], 0xDD);  // 101 + 011 << 3 + (11 of 111) << 6 = 0b11011101
  EXPECT_EQ(packed[1], 0x01);  // remaining high bit of the third code
}

TEST(BitPack, EmptyTensor) {
  std::vector<uint8_t> none;
  EXPECT_EQ(BitsTable::Uniform(3).PackedBytes(0, 5), 0u);
  PackCodes(none.data(), 0, 5, BitsTable::Uniform(3), none.data());
  UnpackCodes(none.data(), 0, 0, 5, BitsTable::Uniform(3), none.data());
}

TEST(BitPack, WrongPackedSizeIsDataLoss) {
  std::vector<uint8_t> packed(3), codes(8);
  try {
    UnpackCodes(packed.data(), packed.size(), 1, 8, BitsTable::Uniform(4), codes.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
    EXPECT_NE(std::string(e.what()).find("need 4"), std::string::npos) << e.what();
  }
}

TEST(BitPack, InvalidTablesAreRejected) {
  std::vector<uint8_t> codes(4), packed(4);
  EXPECT_THROW(PackCodes(codes.data(), 1, 4, BitsTable::Uniform(9), packed.data()), Error);
  EXPECT_THROW(PackCodes(codes.data(), 1, 4, BitsTable::Uniform(0), packed.data()), Error);
  EXPECT_THROW(PackCodes(codes.data(), 1, 4, BitsTable::PerChannel({3, 3}), packed.data()), Error);
}

}  // namespace
}  // namespace amaq::quant
