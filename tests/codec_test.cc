#include "quant/codec.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <functional>

#include "common/base/error.h"
#include "quant/checksum.h"
#include "quant/grid.h"
#include "test_tensors.h"
#include "zstd_bomb.h"

namespace amaq::quant {
namespace {

struct Case {
  Scheme scheme;
  Granularity granularity;
  int group_size;
};

const Case kQuantCases[] = {
    {Scheme::kAffine, Granularity::kTensor, 0},     {Scheme::kAffine, Granularity::kChannel, 0},
    {Scheme::kAffine, Granularity::kToken, 0},      {Scheme::kAffine, Granularity::kGroup, 64},
    {Scheme::kAffine, Granularity::kGroup, 128},    {Scheme::kSymmetric, Granularity::kTensor, 0},
    {Scheme::kSymmetric, Granularity::kChannel, 0}, {Scheme::kSymmetric, Granularity::kToken, 0},
    {Scheme::kSymmetric, Granularity::kGroup, 64},
};

EncodeOptions Options(const Case& c) {
  EncodeOptions o;
  o.scheme = c.scheme;
  o.granularity = c.granularity;
  o.group_size = c.group_size;
  return o;
}

// Error of every element against its own scale group's step.
void ExpectErrorWithinBound(const std::vector<float>& x, const std::vector<float>& x_hat,
                            int64_t rows, int64_t cols, const Case& c, int bits,
                            ScaleFormat format, double steps_allowed) {
  const GridSpec spec{c.scheme, c.granularity, c.group_size};
  const ScaleGrid grid = ComputeGrid(x.data(), rows, cols, spec, BitsTable::Uniform(bits), format);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const int64_t g = ScaleGroupOf(spec, r, col, cols);
      const double step = grid.steps[g];
      const double v = x[r * cols + col], q = x_hat[r * cols + col];
      const double slack = 1e-6 * (std::fabs(v) + std::fabs(grid.zeros[g]) + 256 * step);
      ASSERT_LE(std::fabs(v - q), steps_allowed * step + slack)
          << "element (" << r << ", " << col << ") bits " << bits;
    }
  }
}

TEST(Codec, NearestRoundingErrorIsAtMostHalfAStep) {
  const int64_t rows = 37, cols = 150;  // odd sizes: partial last group
  for (const auto& input : {testing::GaussianTensor(rows, cols, 11),
                            testing::HeavyTailedTensor(rows, cols, 12)}) {
    for (const Case& c : kQuantCases) {
      for (int b = (c.scheme == Scheme::kSymmetric ? 2 : 1); b <= 8; ++b) {
        SCOPED_TRACE(ToString(c.scheme) + " " + ToString(c.granularity) + " bits " + std::to_string(b));
        std::vector<float> recon(input.size());
        Encoder encoder;
        const Encoded e = encoder.Encode(input.data(), rows, cols, BitsTable::Uniform(b), Options(c),
                                         recon.data());
        ExpectErrorWithinBound(input, recon, rows, cols, c, b, ScaleFormat::kFloat16, 0.5);
        const Decoded d = Decoder().Decode(e.bytes.data(), e.bytes.size());
        ASSERT_EQ(d.values, recon) << "decoder and encoder disagree";
        EXPECT_EQ(e.count.total(), e.bytes.size());
        EXPECT_EQ(e.count.payload, BitsTable::Uniform(b).PackedBytes(rows, cols));
        EXPECT_DOUBLE_EQ(e.average_bits, b);
      }
    }
  }
}

TEST(Codec, MoreBitsMeanLessError) {
  const int64_t rows = 64, cols = 64;
  const auto x = testing::GaussianTensor(rows, cols, 5);
  double previous = INFINITY;
  for (int b = 1; b <= 8; ++b) {
    std::vector<float> recon(x.size());
    Encoder().Encode(x.data(), rows, cols, BitsTable::Uniform(b), EncodeOptions{}, recon.data());
    double mse = 0;
    for (size_t i = 0; i < x.size(); ++i) mse += (x[i] - recon[i]) * (x[i] - recon[i]);
    EXPECT_LT(mse, previous * 0.6) << "bits " << b;
    previous = mse;
  }
}

TEST(Codec, StochasticRoundingIsUnbiasedAndWithinOneStep) {
  const int64_t rows = 8, cols = 16;
  const auto x = testing::GaussianTensor(rows, cols, 9);
  const Case c{Scheme::kAffine, Granularity::kChannel, 0};
  EncodeOptions o = Options(c);
  o.rounding = Rounding::kStochastic;
  std::vector<double> mean(x.size(), 0.0);
  const int trials = 2000;
  for (int t = 0; t < trials; ++t) {
    o.seed = static_cast<uint64_t>(t);
    std::vector<float> recon(x.size());
    Encoder().Encode(x.data(), rows, cols, BitsTable::Uniform(2), o, recon.data());
    if (t == 0) ExpectErrorWithinBound(x, recon, rows, cols, c, 2, ScaleFormat::kFloat16, 1.0);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += recon[i] / trials;
  }
  const ScaleGrid grid = ComputeGrid(x.data(), rows, cols, {c.scheme, c.granularity, 0},
                                     BitsTable::Uniform(2), ScaleFormat::kFloat16);
  for (size_t i = 0; i < x.size(); ++i) {
    // The mean of 2000 draws with spread <= step/2 lies within 5 standard errors of x.
    EXPECT_NEAR(mean[i], x[i], 5 * grid.steps[i % cols] * 0.5 / std::sqrt(trials)) << i;
  }
}

TEST(Codec, MixedBitsPerChannelAndPerToken) {
  const int64_t rows = 24, cols = 40;
  const auto x = testing::GaussianTensor(rows, cols, 21);
  std::vector<uint8_t> per_channel(cols), per_token(rows);
  for (int64_t c = 0; c < cols; ++c) per_channel[c] = static_cast<uint8_t>(1 + c % 8);
  for (int64_t r = 0; r < rows; ++r) per_token[r] = static_cast<uint8_t>(8 - r % 6);
  struct Mixed {
    BitsTable bits;
    Granularity granularity;
  };
  for (const Mixed& m : {Mixed{BitsTable::PerChannel(per_channel), Granularity::kChannel},
                         Mixed{BitsTable::PerToken(per_token), Granularity::kToken}}) {
    EncodeOptions o;
    o.granularity = m.granularity;
    std::vector<float> recon(x.size());
    const Encoded e = Encoder().Encode(x.data(), rows, cols, m.bits, o, recon.data());
    EXPECT_EQ(e.count.payload, m.bits.PackedBytes(rows, cols));
    EXPECT_DOUBLE_EQ(e.average_bits, m.bits.AverageBits(rows, cols));
    const Decoded d = Decoder().Decode(e.bytes.data(), e.bytes.size());
    EXPECT_EQ(d.values, recon);
    EXPECT_EQ(d.bits, m.bits);
    // Each element within half a step of its own width.
    const ScaleGrid grid = ComputeGrid(x.data(), rows, cols, {Scheme::kAffine, m.granularity, 0},
                                       m.bits, ScaleFormat::kFloat16);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float step = grid.steps[m.granularity == Granularity::kChannel ? c : r];
        ASSERT_LE(std::fabs(x[r * cols + c] - recon[r * cols + c]), step * 0.5f * 1.0001f + 1e-6f);
      }
    }
  }
}

TEST(Codec, FloatSchemesPassThrough) {
  const int64_t rows = 5, cols = 7;
  const auto x = testing::GaussianTensor(rows, cols, 2);
  for (Scheme s : {Scheme::kFloat32, Scheme::kBFloat16, Scheme::kFloat16}) {
    EncodeOptions o;
    o.scheme = s;
    std::vector<float> recon(x.size());
    const Encoded e = Encoder().Encode(x.data(), rows, cols, BitsTable{}, o, recon.data());
    EXPECT_EQ(e.count.payload, x.size() * (s == Scheme::kFloat32 ? 4 : 2));
    const Decoded d = Decoder().Decode(e.bytes.data(), e.bytes.size());
    EXPECT_EQ(d.values, recon);
    for (size_t i = 0; i < x.size(); ++i) {
      const float rel = s == Scheme::kFloat32 ? 0.0f : (s == Scheme::kBFloat16 ? 1.0f / 256 : 1.0f / 2048);
      EXPECT_LE(std::fabs(recon[i] - x[i]), rel * std::fabs(x[i])) << ToString(s);
    }
  }
}

TEST(Codec, OneElementAndEmptyTensors) {
  const float one = 3.25f;
  for (int b = 1; b <= 8; ++b) {
    const Encoded e = Encoder().Encode(&one, 1, 1, BitsTable::Uniform(b), EncodeOptions{});
    EXPECT_EQ(Decoder().Decode(e.bytes.data(), e.bytes.size()).values, std::vector<float>{one});
  }
  const Encoded empty = Encoder().Encode(nullptr, 0, 16, BitsTable::Uniform(3), EncodeOptions{});
  const Decoded d = Decoder().Decode(empty.bytes.data(), empty.bytes.size());
  EXPECT_EQ(d.rows, 0);
  EXPECT_EQ(d.cols, 16);
  EXPECT_TRUE(d.values.empty());
}

TEST(Codec, MetadataAccounting) {
  const int64_t rows = 256, cols = 512;
  const auto x = testing::GaussianTensor(rows, cols, 4);
  const Encoded e = Encoder().Encode(x.data(), rows, cols, BitsTable::Uniform(3), EncodeOptions{});
  // header 48 + one table entry + (zero, step) fp16 per channel + checksum 8
  EXPECT_EQ(e.count.metadata, 48u + 1u + 4u * cols + 8u);
  EXPECT_EQ(e.count.payload, static_cast<uint64_t>(rows * cols * 3 / 8));
}

TEST(Codec, BitsTableIsSentOnlyWhenItChanges) {
  const int64_t rows = 4, cols = 32;
  const auto x = testing::GaussianTensor(rows, cols, 8);
  std::vector<uint8_t> widths(cols, 5);
  widths[3] = 2;
  const BitsTable table = BitsTable::PerChannel(widths);
  Encoder encoder;
  Decoder decoder;
  const Encoded first = encoder.Encode(x.data(), rows, cols, table, EncodeOptions{});
  const Encoded second = encoder.Encode(x.data(), rows, cols, table, EncodeOptions{});
  EXPECT_EQ(first.bytes.size(), second.bytes.size() + cols);
  const Decoded from_first = decoder.Decode(first.bytes.data(), first.bytes.size());
  const Decoded from_second = decoder.Decode(second.bytes.data(), second.bytes.size());
  EXPECT_EQ(from_first.values, from_second.values);
  EXPECT_EQ(from_second.bits, table);

  // A decoder that missed the table refuses the reference and keeps working afterwards.
  Decoder fresh;
  try {
    fresh.Decode(second.bytes.data(), second.bytes.size());
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kFailedPrecondition);
  }
  encoder.Reset();
  const Encoded resent = encoder.Encode(x.data(), rows, cols, table, EncodeOptions{});
  EXPECT_EQ(resent.bytes.size(), first.bytes.size());
  EXPECT_NO_THROW(fresh.Decode(resent.bytes.data(), resent.bytes.size()));

  // A changed table is sent again.
  widths[3] = 6;
  const Encoded changed = encoder.Encode(x.data(), rows, cols, BitsTable::PerChannel(widths),
                                         EncodeOptions{});
  EXPECT_EQ(changed.bytes.size(), first.bytes.size() + (6 - 2) * rows / 8);
}

TEST(Codec, ZstdIsUsedOnlyWhenItShrinksThePayload) {
  const int64_t rows = 64, cols = 64;
  std::vector<float> smooth(rows * cols);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = static_cast<float>(i % 3);  // compressible
  EncodeOptions o;
  o.zstd = true;
  const Encoded plain = Encoder().Encode(smooth.data(), rows, cols, BitsTable::Uniform(8), EncodeOptions{});
  const Encoded packed = Encoder().Encode(smooth.data(), rows, cols, BitsTable::Uniform(8), o);
  EXPECT_LT(packed.count.payload, plain.count.payload / 4);
  EXPECT_EQ(Decoder().Decode(packed.bytes.data(), packed.bytes.size()).values,
            Decoder().Decode(plain.bytes.data(), plain.bytes.size()).values);

  const auto noise = testing::GaussianTensor(rows, cols, 1);  // 3-bit codes of noise barely compress
  const Encoded noisy = Encoder().Encode(noise.data(), rows, cols, BitsTable::Uniform(3), o);
  EXPECT_LE(noisy.count.payload, BitsTable::Uniform(3).PackedBytes(rows, cols));
  EXPECT_NO_THROW(Decoder().Decode(noisy.bytes.data(), noisy.bytes.size()));
}

TEST(Codec, NonFiniteInputIsRefused) {
  std::vector<float> x(16, 1.0f);
  x[5] = -INFINITY;
  for (Scheme s : {Scheme::kFloat32, Scheme::kAffine}) {
    EncodeOptions o;
    o.scheme = s;
    EXPECT_THROW(Encoder().Encode(x.data(), 4, 4, BitsTable::Uniform(4), o), Error);
  }
}

// ---- malformed input: every case is an amaq::Error, never a crash ----

// Recomputes the trailing checksum so that a deliberately broken field reaches its own check.
void Reseal(std::vector<uint8_t>* bytes) {
  const uint64_t sum = WireChecksum(bytes->data(), bytes->size() - 8);
  std::memcpy(bytes->data() + bytes->size() - 8, &sum, 8);
}

ErrorCode DecodeError(const std::vector<uint8_t>& bytes) {
  try {
    Decoder().Decode(bytes.data(), bytes.size());
  } catch (const Error& e) {
    EXPECT_GT(std::strlen(e.what()), 20u);
    return e.code();
  }
  ADD_FAILURE() << "malformed message was accepted";
  return ErrorCode::kInternal;
}

class MalformedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    x_ = testing::GaussianTensor(6, 10, 3);
    good_ = Encoder().Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{}).bytes;
  }
  std::vector<uint8_t> Modified(size_t offset, std::vector<uint8_t> value) {
    std::vector<uint8_t> b = good_;
    std::memcpy(b.data() + offset, value.data(), value.size());
    Reseal(&b);
    return b;
  }
  std::vector<float> x_;
  std::vector<uint8_t> good_;
};

TEST_F(MalformedTest, EveryTruncationIsRefused) {
  for (size_t n = 0; n < good_.size(); ++n) {
    std::vector<uint8_t> cut(good_.begin(), good_.begin() + static_cast<long>(n));
    EXPECT_EQ(DecodeError(cut), ErrorCode::kDataLoss) << "length " << n;
  }
}

TEST_F(MalformedTest, EveryFlippedByteIsRefused) {
  for (size_t i = 0; i < good_.size(); ++i) {
    std::vector<uint8_t> b = good_;
    b[i] ^= 0x5a;
    EXPECT_EQ(DecodeError(b), ErrorCode::kDataLoss) << "byte " << i;
  }
}

TEST_F(MalformedTest, FieldsAreValidatedBehindAValidChecksum) {
  EXPECT_EQ(DecodeError(Modified(0, {'X'})), ErrorCode::kDataLoss);             // magic
  EXPECT_EQ(DecodeError(Modified(4, {2})), ErrorCode::kDataLoss);               // version
  EXPECT_EQ(DecodeError(Modified(5, {9})), ErrorCode::kDataLoss);               // scheme
  EXPECT_EQ(DecodeError(Modified(6, {7})), ErrorCode::kDataLoss);               // granularity
  EXPECT_EQ(DecodeError(Modified(9, {0x80})), ErrorCode::kDataLoss);            // unknown flag
  EXPECT_EQ(DecodeError(Modified(16, {7})), ErrorCode::kDataLoss);              // rows disagree
  EXPECT_EQ(DecodeError(Modified(24, {11})), ErrorCode::kDataLoss);             // cols disagree
  EXPECT_EQ(DecodeError(Modified(48, {9})), ErrorCode::kDataLoss);              // bits 9
  EXPECT_EQ(DecodeError(Modified(48, {0})), ErrorCode::kDataLoss);              // bits 0
  EXPECT_EQ(DecodeError(Modified(40, {1})), ErrorCode::kDataLoss);              // payload size
  EXPECT_EQ(DecodeError(Modified(16, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f})),
            ErrorCode::kResourceExhausted);                                   // huge shape
  EXPECT_EQ(DecodeError(Modified(36, {0xff, 0xff, 0xff, 0x7f})), ErrorCode::kDataLoss);
}

TEST_F(MalformedTest, NonFiniteOrNonPositiveScalesAreRefused) {
  const size_t steps_at = 48 + 1 + 2 * 10;  // header, one table entry, ten fp16 zeros
  EXPECT_EQ(DecodeError(Modified(steps_at, {0x00, 0x7e})), ErrorCode::kDataLoss);  // NaN
  EXPECT_EQ(DecodeError(Modified(steps_at, {0x00, 0x7c})), ErrorCode::kDataLoss);  // +inf
  EXPECT_EQ(DecodeError(Modified(steps_at, {0x00, 0x00})), ErrorCode::kDataLoss);  // 0
  EXPECT_EQ(DecodeError(Modified(steps_at, {0x00, 0xbc})), ErrorCode::kDataLoss);  // -1
  EXPECT_EQ(DecodeError(Modified(48 + 1, {0x00, 0x7c})), ErrorCode::kDataLoss);    // zero = inf
}

TEST_F(MalformedTest, NonFiniteFloatPayloadIsRefused) {
  EncodeOptions o;
  o.scheme = Scheme::kFloat32;
  std::vector<uint8_t> b = Encoder().Encode(x_.data(), 6, 10, BitsTable{}, o).bytes;
  const float nan = std::nanf("");
  std::memcpy(b.data() + 48 + 4 * 7, &nan, 4);
  Reseal(&b);
  EXPECT_EQ(DecodeError(b), ErrorCode::kInvalidArgument);
}

// A message that breaks several rules is refused for the first in docs/wire-format.md's order,
// with that rule's code: the expected shape before the element limit, a referenced table before
// the scales, the scales before the payload.
TEST_F(MalformedTest, TheFirstRuleBrokenInTheDocumentsOrderDecidesTheCode) {
  std::vector<uint8_t> huge_and_elsewhere = good_;
  std::memcpy(huge_and_elsewhere.data() + 16, std::vector<uint8_t>{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f}.data(), 8);
  Reseal(&huge_and_elsewhere);
  try {
    Decoded d;
    Decoder().Decode(huge_and_elsewhere.data(), huge_and_elsewhere.size(), &d, ExpectedShape{6, 10});
    ADD_FAILURE() << "refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << "the shape's check comes before the limit's: " << e.what();
  }
  // Refers to a table the decoder lacks and has a step of 0: the table's check comes first.
  Encoder encoder;
  encoder.Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{});
  std::vector<uint8_t> referring = encoder.Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{}).bytes;
  const size_t steps_at = 48 + 2 * 10;  // header, no table, ten fp16 zeros
  referring[steps_at] = referring[steps_at + 1] = 0;
  Reseal(&referring);
  EXPECT_EQ(DecodeError(referring), ErrorCode::kFailedPrecondition);
  // A zero step and a payload size that disagrees: the scales come first (both DATA_LOSS; the text says which).
  std::vector<uint8_t> both = Modified(48 + 1 + 2 * 10, {0x00, 0x00});
  both[40] ^= 1;
  Reseal(&both);
  try {
    Decoder().Decode(both.data(), both.size());
    ADD_FAILURE() << "refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("steps must be finite and positive"), std::string::npos) << e.what();
  }
}

// A refused message changes nothing: the table it carried is not installed, so the next message
// that refers to it is refused too (FAILED_PRECONDITION: the sender resends it with its table).
TEST_F(MalformedTest, ARefusedMessageDoesNotInstallItsTable) {
  Encoder encoder;
  Decoder decoder;
  const std::vector<uint8_t> first = encoder.Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{}).bytes;
  decoder.Decode(first.data(), first.size());
  std::vector<uint8_t> second = encoder.Encode(x_.data(), 6, 10, BitsTable::Uniform(4), EncodeOptions{}).bytes;
  second[48 + 1 + 2 * 10] = second[48 + 1 + 2 * 10 + 1] = 0;  // a step of 0 behind the new table
  Reseal(&second);
  EXPECT_THROW(decoder.Decode(second.data(), second.size()), Error);
  const std::vector<uint8_t> third = encoder.Encode(x_.data(), 6, 10, BitsTable::Uniform(4), EncodeOptions{}).bytes;
  try {
    decoder.Decode(third.data(), third.size());
    ADD_FAILURE() << "the refused message's table must not be installed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << e.what();
  }
  Encoder same_table;  // its second message refers to the first's table, which the decoder still holds
  same_table.Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{});
  const std::vector<uint8_t> referring = same_table.Encode(x_.data(), 6, 10, BitsTable::Uniform(3), EncodeOptions{}).bytes;
  EXPECT_NO_THROW(decoder.Decode(referring.data(), referring.size())) << "the stream's table is still the first message's";
}

TEST_F(MalformedTest, DecompressionBombIsRefused) {
  // A valid zstd frame that expands to far more than the shape allows.
  std::vector<uint8_t> huge(1 << 20, 0);
  std::vector<uint8_t> frame(ZSTD_compressBound(huge.size()));
  frame.resize(ZSTD_compress(frame.data(), frame.size(), huge.data(), huge.size(), 1));
  std::vector<uint8_t> b(good_.begin(), good_.begin() + 48 + 1 + 40);  // header, table, scales
  b[9] |= 1;                                                           // zstd flag
  const uint64_t size = frame.size();
  std::memcpy(b.data() + 40, &size, 8);
  b.insert(b.end(), frame.begin(), frame.end());
  b.resize(b.size() + 8);
  Reseal(&b);
  EXPECT_EQ(DecodeError(b), ErrorCode::kDataLoss);
}

// What docs/wire-format.md fixes beyond each field's range, refused behind a valid checksum.
TEST_F(MalformedTest, WhatTheWrittenFormatFixesIsChecked) {
  EXPECT_EQ(DecodeError(Modified(12, {4})), ErrorCode::kDataLoss) << "group_size on a per-channel message";
  // 6 x 10 codes of 3 bits: 180 bits, so the last payload byte holds 4 bits and 4 of padding.
  std::vector<uint8_t> padded = good_;
  padded[padded.size() - 9] |= 0x80;
  Reseal(&padded);
  EXPECT_EQ(DecodeError(padded), ErrorCode::kDataLoss) << "a set bit after the last code";

  EncodeOptions group;
  group.granularity = Granularity::kGroup;
  group.group_size = 4;
  std::vector<uint8_t> b = Encoder().Encode(x_.data(), 6, 10, BitsTable::Uniform(3), group).bytes;
  std::memset(b.data() + 12, 0, 4);
  Reseal(&b);
  EXPECT_EQ(DecodeError(b), ErrorCode::kDataLoss) << "group granularity without a group size";

  EncodeOptions fp32;
  fp32.scheme = Scheme::kFloat32;
  const std::vector<uint8_t> floats = Encoder().Encode(x_.data(), 6, 10, BitsTable{}, fp32).bytes;
  for (const size_t offset : {size_t{8}, size_t{32}}) {  // scale_format, bits_table_id
    b = floats;
    b[offset] = 1;
    Reseal(&b);
    EXPECT_EQ(DecodeError(b), ErrorCode::kDataLoss) << "a float message with byte " << offset << " set";
  }

  EncodeOptions symmetric;
  symmetric.scheme = Scheme::kSymmetric;
  b = Encoder().Encode(x_.data(), 6, 10, BitsTable::Uniform(3), symmetric).bytes;
  EXPECT_NO_THROW(Decoder().Decode(b.data(), b.size()));
  b[48 + 1 + 2 * 10] |= 0x07;  // the first code becomes 7 = 2^3 - 1 (after the table and ten steps)
  Reseal(&b);
  EXPECT_EQ(DecodeError(b), ErrorCode::kDataLoss) << "symmetric code 2^b - 1";
}

// A finite value that a 16-bit cast would turn into infinity is refused by the encoder, with the
// way out; it used to arrive as infinity and be refused by the receiver as divergence.
TEST(Codec, SixteenBitCastsRefuseValuesBeyondTheirRange) {
  const auto encode = [](float value, Scheme scheme) {
    std::vector<float> x(8, 1.0f);
    x[3] = value;
    EncodeOptions o;
    o.scheme = scheme;
    return Encoder().Encode(x.data(), 2, 4, BitsTable{}, o);
  };
  try {
    encode(70000.0f, Scheme::kFloat16);
    ADD_FAILURE() << "70000 does not fit fp16";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("beyond the range of fp16"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(encode(65504.0f, Scheme::kFloat16));
  EXPECT_NO_THROW(encode(70000.0f, Scheme::kBFloat16));
  EXPECT_THROW(encode(std::numeric_limits<float>::max(), Scheme::kBFloat16), Error);
  EXPECT_NO_THROW(encode(std::numeric_limits<float>::max(), Scheme::kFloat32));
}

// Whatever the encoder writes, the decoder takes: groups of +-1e38 at 4 bits, affine and symmetric,
// group-wise and per channel, decode (the decoder used to check every group against 255 steps,
// which overflows fp32 at 4 bits). A grid that would decode beyond fp32 (symmetric 2 bits of
// 2e38: zero + 2 steps is 4e38) is refused by the encoder with the decoder's own text.
TEST(Codec, WhatTheEncoderWritesNearFp32sLimitTheDecoderTakes) {
  std::vector<float> x(4 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1e38f : i % 3 == 1 ? 1e38f : 0.0f);
  for (const Scheme scheme : {Scheme::kAffine, Scheme::kSymmetric}) {
    for (const Granularity granularity : {Granularity::kGroup, Granularity::kChannel}) {
      EncodeOptions o;
      o.scheme = scheme;
      o.granularity = granularity;
      o.group_size = 64;
      std::vector<float> hat(x.size());
      const Encoded e = Encoder().Encode(x.data(), 4, 64, BitsTable::Uniform(4), o, hat.data());
      Decoded d;
      ASSERT_NO_THROW(Decoder().Decode(e.bytes.data(), e.bytes.size(), &d)) << ToString(scheme) << " " << ToString(granularity);
      EXPECT_EQ(d.values, hat);
    }
  }
  std::vector<float> wide(8, 2e38f);
  wide[0] = -2e38f;
  EncodeOptions o;
  o.scheme = Scheme::kSymmetric;
  o.granularity = Granularity::kTensor;
  try {
    Encoder().Encode(wide.data(), 2, 4, BitsTable::Uniform(2), o);
    ADD_FAILURE() << "a grid that decodes beyond fp32 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("beyond fp32's range"), std::string::npos) << e.what();
  }
}

// A message whose header declares a shape far above the step's (1 GiB of fp32 zeros from 32 KiB
// of RLE blocks) is refused from its header: nothing is decompressed or allocated.
TEST(Codec, MessageOfAnotherShapeThanExpectedIsRefusedBeforeDecompressing) {
  const std::vector<uint8_t> small = testing::ZstdBombMessage(4, 8);
  EXPECT_EQ(Decoder().Decode(small.data(), small.size()).values, std::vector<float>(32, 0.0f)) << "the bomb is a valid message";
  const std::vector<uint8_t> bomb = testing::ZstdBombMessage(uint64_t{1} << 20, 256);
  EXPECT_LT(bomb.size(), 40000u);
  Decoded d;
  try {
    Decoder().Decode(bomb.data(), bomb.size(), &d, ExpectedShape{2, 256});
    ADD_FAILURE() << "a message of 2^20 rows where the step has 2 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1048576, 256]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.values.capacity(), 0u) << "nothing was allocated for the values";
  EXPECT_NO_THROW(Decoder().Decode(small.data(), small.size(), &d, ExpectedShape{4, 8}));
}

}  // namespace
}  // namespace amaq::quant
