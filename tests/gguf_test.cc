// The GGUF reader against the format's definition (ggml's block layouts, gguf.md's header). Each
// quantized type is checked on hand-made blocks: a packer below places chosen codes, scales and
// minimums where the format says element e's bits go (written per element, not per loop of the
// decoder), and the expected value of e is computed from its code by the type's formula. Scales
// are powers of two and small integers, so every expected value is exact.
#include "common/model/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/base/error.h"
#include "common/base/half.h"
#include "gguf_writer.h"

namespace amaq {
namespace {

using quant::FloatToHalf;
using testing_gguf::GgufWriter;
using testing_gguf::SampleFile;

void PutHalf(std::vector<uint8_t>& b, size_t at, float value) {
  const uint16_t h = FloatToHalf(value);
  b[at] = static_cast<uint8_t>(h & 0xFF);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

// Sets bit `bit` of the byte at `at`.
void SetBit(std::vector<uint8_t>& b, size_t at, int bit, bool on) {
  if (on) b[at] |= static_cast<uint8_t>(1u << bit);
}

std::vector<float> Dequantized(GgmlType type, const std::vector<uint8_t>& blocks, int64_t elements) {
  std::vector<float> out(static_cast<size_t>(elements));
  DequantizeBlocks(type, blocks.data(), elements, out.data());
  return out;
}

struct SmallCase {
  GgmlType type;
  int bits;       // 4 or 5
  bool has_min;   // Q4_1 / Q5_1: y = d*q + m; else y = d*(q - 2^(bits-1))
};

// Q4_0, Q4_1, Q5_0, Q5_1 (32 elements): fp16 d, [fp16 m], [u32 qh: bit e = bit 4 of element e],
// 16 bytes qs: byte j's low nibble is element j, its high nibble element j + 16.
TEST(Gguf, SmallBlocksFollowTheDefinition) {
  std::mt19937 rng(1);
  for (const SmallCase c : {SmallCase{GgmlType::kQ4_0, 4, false}, SmallCase{GgmlType::kQ4_1, 4, true},
                            SmallCase{GgmlType::kQ5_0, 5, false}, SmallCase{GgmlType::kQ5_1, 5, true}}) {
    const auto info = *GgmlTypeFor(static_cast<uint32_t>(c.type));
    const float d = 0.25f, m = -1.5f;
    std::vector<uint8_t> block(static_cast<size_t>(info.block_bytes), 0);
    PutHalf(block, 0, d);
    size_t qh_at = 2, qs_at = 2;
    if (c.has_min) {
      PutHalf(block, 2, m);
      qh_at = qs_at = 4;
    }
    if (c.bits == 5) qs_at += 4;
    std::vector<float> expected(32);
    for (int e = 0; e < 32; ++e) {
      const int q = static_cast<int>(rng() % (1u << c.bits));
      const int nibble = q & 0xF;
      block[qs_at + e % 16] |= static_cast<uint8_t>(e < 16 ? nibble : nibble << 4);
      if (c.bits == 5) SetBit(block, qh_at + e / 8, e % 8, (q >> 4) & 1);
      expected[e] = c.has_min ? d * static_cast<float>(q) + m
                              : d * static_cast<float>(q - (1 << (c.bits - 1)));
    }
    EXPECT_EQ(Dequantized(c.type, block, 32), expected) << info.name;
  }
}

TEST(Gguf, Q8_0IsAScaledSignedByte) {
  std::vector<uint8_t> block(34, 0);
  PutHalf(block, 0, -0.5f);
  std::vector<float> expected(32);
  for (int e = 0; e < 32; ++e) {
    const int q = e * 8 - 128;  // -128 .. 120
    block[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(q));
    expected[e] = -0.5f * static_cast<float>(q);
  }
  EXPECT_EQ(Dequantized(GgmlType::kQ8_0, block, 32), expected);
}

// The 6-bit scale s and min m of sub-block j in the 12 bytes of a Q4_K / Q5_K super-block: for
// j < 4, the low 6 bits of bytes j (scale) and j + 4 (min); for j >= 4, the scale's low 4 bits are
// byte j + 4's low nibble and its high 2 bits byte j - 4's top bits; the min's low 4 bits are
// byte j + 4's high nibble and its high 2 bits byte j's top bits.
void PackScaleMin(std::vector<uint8_t>& b, size_t at, int j, int s, int m) {
  if (j < 4) {
    b[at + j] |= static_cast<uint8_t>(s);
    b[at + j + 4] |= static_cast<uint8_t>(m);
  } else {
    b[at + j + 4] |= static_cast<uint8_t>((s & 0xF) | (m & 0xF) << 4);
    b[at + j - 4] |= static_cast<uint8_t>((s >> 4) << 6);
    b[at + j] |= static_cast<uint8_t>((m >> 4) << 6);
  }
}

// Q4_K and Q5_K (256 elements in 8 sub-blocks of 32): fp16 d, fp16 dmin, 12 bytes of scales and
// mins, [Q5_K: 32 bytes qh], 128 bytes qs. Element e = 64p + 32h + l (pair p, half h) has its low
// 4 bits in qs[32p + l] (low nibble for h = 0), its fifth bit at bit 2p + h of qh[l], and
// y = d * s(2p+h) * q - dmin * m(2p+h).
TEST(Gguf, KQuantsFollowTheDefinition) {
  std::mt19937 rng(2);
  for (const bool five : {false, true}) {
    const GgmlType type = five ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    const auto info = *GgmlTypeFor(static_cast<uint32_t>(type));
    for (int blocks = 1; blocks <= 2; ++blocks) {
      std::vector<uint8_t> data(static_cast<size_t>(info.block_bytes * blocks), 0);
      std::vector<float> expected(static_cast<size_t>(256 * blocks));
      for (int b = 0; b < blocks; ++b) {
        const size_t at = static_cast<size_t>(b * info.block_bytes);
        const float d = b == 0 ? 0.125f : 2.0f, dmin = b == 0 ? 0.5f : 0.0625f;
        PutHalf(data, at, d);
        PutHalf(data, at + 2, dmin);
        int s[8], m[8];
        for (int j = 0; j < 8; ++j) {
          s[j] = static_cast<int>(rng() % 64);
          m[j] = static_cast<int>(rng() % 64);
          PackScaleMin(data, at + 4, j, s[j], m[j]);
        }
        const size_t qh_at = at + 16, qs_at = at + (five ? 48 : 16);
        for (int e = 0; e < 256; ++e) {
          const int p = e / 64, h = (e / 32) % 2, l = e % 32, j = 2 * p + h;
          const int q = static_cast<int>(rng() % (five ? 32u : 16u));
          data[qs_at + 32 * p + l] |= static_cast<uint8_t>(h == 0 ? (q & 0xF) : (q & 0xF) << 4);
          if (five) SetBit(data, qh_at + l, 2 * p + h, (q >> 4) & 1);
          expected[256 * b + e] = d * static_cast<float>(s[j]) * static_cast<float>(q) -
                                  dmin * static_cast<float>(m[j]);
        }
      }
      EXPECT_EQ(Dequantized(type, data, 256 * blocks), expected) << info.name << " x" << blocks;
    }
  }
}

// Q6_K (256 elements): 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d. Element e = 128n + 32k +
// l (half n, quarter k) has its low 4 bits in ql[64n + 32(k % 2) + l] (low nibble for k < 2), its
// high 2 bits at bits 2k, 2k+1 of qh[32n + l], scale sc[8n + 2k + l / 16], and y = d * sc * (q - 32).
TEST(Gguf, Q6KFollowsTheDefinition) {
  std::mt19937 rng(3);
  std::vector<uint8_t> block(210, 0);
  const float d = 0.03125f;
  PutHalf(block, 208, d);
  int sc[16];
  for (int i = 0; i < 16; ++i) {
    sc[i] = static_cast<int>(rng() % 256) - 128;
    block[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(sc[i]));
  }
  std::vector<float> expected(256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, k = (e / 32) % 4, l = e % 32;
    const int q = static_cast<int>(rng() % 64);
    block[64 * n + 32 * (k % 2) + l] |= static_cast<uint8_t>(k < 2 ? (q & 0xF) : (q & 0xF) << 4);
    block[128 + 32 * n + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
    expected[e] = d * static_cast<float>(sc[8 * n + 2 * k + l / 16] * (q - 32));
  }
  EXPECT_EQ(Dequantized(GgmlType::kQ6_K, block, 256), expected);
}

TEST(Gguf, FloatTypesAreReadLittleEndian) {
  const std::vector<float> values = {1.0f, -2.5f, 65504.0f, 0.0f};
  std::vector<uint8_t> f32(16), f16(8, 0), bf16(8);
  std::memcpy(f32.data(), values.data(), 16);
  for (int i = 0; i < 4; ++i) {
    PutHalf(f16, 2 * i, values[i]);
    const uint16_t b = quant::FloatToBFloat16(values[i]);
    bf16[2 * i] = static_cast<uint8_t>(b & 0xFF);
    bf16[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  EXPECT_EQ(Dequantized(GgmlType::kF32, f32, 4), values);
  EXPECT_EQ(Dequantized(GgmlType::kF16, f16, 4), values);
  EXPECT_EQ(Dequantized(GgmlType::kBF16, bf16, 4), (std::vector<float>{1.0f, -2.5f, 65536.0f, 0.0f}));
}

TEST(Gguf, ReadsEveryValueTypeAndTheTensors) {
  for (const uint32_t version : {2u, 3u}) {
    const auto bytes = SampleFile(version);
    const GgufFile f = GgufFile::Parse(bytes.data(), bytes.size(), "sample.gguf");
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.Integer("u8"), 200);
    EXPECT_EQ(f.Integer("i8"), -2);
    EXPECT_EQ(f.Integer("u16"), 0x1234);
    EXPECT_EQ(f.Integer("i16"), -1);
    EXPECT_EQ(f.Integer("u32"), 4000000000);
    EXPECT_EQ(f.Integer("i32"), -7);
    EXPECT_FLOAT_EQ(f.Real("f32"), 1e-5f);
    EXPECT_TRUE(f.metadata().at("bool").boolean);
    EXPECT_EQ(f.Text("general.architecture"), "llama");
    EXPECT_EQ(f.Integer("u64"), int64_t{1} << 40);
    EXPECT_EQ(f.Integer("i64"), -3);
    EXPECT_DOUBLE_EQ(f.Real("f64"), 10000.5);
    EXPECT_DOUBLE_EQ(f.Real("u32"), 4e9);  // an integer read as a number
    EXPECT_EQ(f.Texts("tokens"), (std::vector<std::string>{"a", "b c", ""}));
    const GgufValue& nested = f.metadata().at("nested");
    ASSERT_EQ(nested.elements.size(), 2u);
    EXPECT_EQ(nested.elements[0].elements.size(), 2u);
    EXPECT_EQ(nested.elements[0].elements[1].integer, 2);
    EXPECT_TRUE(nested.elements[1].elements.empty());

    ASSERT_EQ(f.tensors().size(), 2u);
    const GgufTensorInfo& w = f.Tensor("w");
    EXPECT_EQ(w.dims, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(f.Dequantize(w), (std::vector<float>{-3.5f, -2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 3.5f}));
    const GgufTensorInfo& q = f.Tensor("q");
    EXPECT_STREQ(q.type.name, "Q8_0");
    EXPECT_EQ(q.bytes, 34u);
    const auto qv = f.Dequantize(q);
    EXPECT_EQ(qv.front(), -16.0f);
    EXPECT_EQ(qv.back(), 15.0f);
  }
}

TEST(Gguf, WrongTypeOrMissingKeyNamesTheKey) {
  const auto bytes = SampleFile();
  const GgufFile f = GgufFile::Parse(bytes.data(), bytes.size(), "sample.gguf");
  for (const auto& read : std::vector<std::function<void()>>{
           [&] { f.Integer("general.architecture"); }, [&] { f.Text("u8"); }, [&] { f.Real("tokens"); },
           [&] { f.Texts("nested"); }, [&] { f.Integer("llama.block_count"); }}) {
    try {
      read();
      ADD_FAILURE() << "a wrong read did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
      EXPECT_NE(std::string(e.what()).find("sample.gguf: metadata '"), std::string::npos) << e.what();
    }
  }
  try {
    f.Tensor("output.weight");
    ADD_FAILURE() << "a missing tensor did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

ErrorCode ParseError(const std::vector<uint8_t>& bytes, std::string* message = nullptr) {
  try {
    GgufFile::Parse(bytes.data(), bytes.size(), "bad.gguf");
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kInternal;  // no error: the callers expect one
}

TEST(Gguf, EveryTruncationIsRefused) {
  const auto bytes = SampleFile();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(ParseError(prefix), ErrorCode::kDataLoss) << "a file cut at " << n << " of " << bytes.size();
  }
}

// Patches a little-endian u64 or u32 at `at` of the sample file.
std::vector<uint8_t> Patched(size_t at, uint64_t value, size_t width) {
  auto bytes = SampleFile();
  std::memcpy(bytes.data() + at, &value, width);
  return bytes;
}

size_t Find(const std::vector<uint8_t>& bytes, const std::string& needle) {
  const auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  return static_cast<size_t>(it - bytes.begin());
}

TEST(Gguf, MalformedHeadersAreRefusedWithTheReason) {
  const auto sample = SampleFile();
  const size_t w_info = Find(sample, std::string("\x01\0\0\0\0\0\0\0w", 9)) + 9;  // after "w"'s name
  const size_t q_info = Find(sample, std::string("\x01\0\0\0\0\0\0\0q", 9)) + 9;
  const size_t tokens_count = Find(sample, "tokens") + 6 + 4 + 4;  // key, type 9, element type 8
  struct Case {
    std::vector<uint8_t> bytes;
    std::string reason;
  };
  std::vector<Case> cases = {
      {Patched(0, 0x47475546, 4), "it is not a GGUF file"},  // "FUGG"
      {Patched(4, 1, 4), "amaq reads versions 2 and 3"},
      {Patched(4, 4, 4), "amaq reads versions 2 and 3"},
      {Patched(8, uint64_t{1} << 60, 8), "the tensor count is"},
      {Patched(16, uint64_t{1} << 62, 8), "the metadata count is"},
      {Patched(24, uint64_t{1} << 50, 8), "truncated"},                           // key length
      {Patched(tokens_count, 1000000, 8), "element count is"},
      {Patched(Find(sample, "u8") + 2, 13, 4), "value type 13"},
      {Patched(w_info, 5, 4), "dimensions, not 1..4"},
      {Patched(w_info + 4, 0, 8), "has a dimension of 0"},
      {Patched(w_info + 20, 16, 4), "ggml type 16"},                            // IQ2_XXS
      {Patched(w_info + 24, 32, 8), "not a multiple of the alignment 64"},
      {Patched(q_info + 4 + 8 + 4, 128, 8), "ends past the data section"},
      {Patched(q_info + 4, 33, 8), "not whole Q8_0 blocks"},
      {Patched(Find(sample, "general.alignment") + 17 + 4, 48, 4), "not a power of two"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string message;
    EXPECT_EQ(ParseError(cases[i].bytes, &message), ErrorCode::kDataLoss) << "case " << i;
    EXPECT_NE(message.find(cases[i].reason), std::string::npos) << "case " << i << ": " << message;
    EXPECT_EQ(message.rfind("bad.gguf", 0), 0u) << "case " << i << " does not name the file: " << message;
  }
}

TEST(Gguf, ARepeatedKeyOrTensorIsRefused) {
  auto bytes = SampleFile();
  // Rename "i8" to "u8" and "q" to "w".
  bytes[Find(bytes, "i8")] = 'u';
  bytes[Find(bytes, std::string("\x01\0\0\0\0\0\0\0q", 9)) + 8] = 'w';
  std::string message;
  EXPECT_EQ(ParseError(bytes, &message), ErrorCode::kDataLoss);
  EXPECT_NE(message.find("'u8' appears twice"), std::string::npos) << message;
  bytes[Find(bytes, "u8")] = 'i';
  EXPECT_EQ(ParseError(bytes, &message), ErrorCode::kDataLoss);
  EXPECT_NE(message.find("tensor 'w' appears twice"), std::string::npos) << message;
}

TEST(Gguf, OpenNamesAMissingOrEmptyFile) {
  try {
    GgufFile::Open("/nonexistent/model.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  const std::string empty = testing::TempDir() + "/empty.gguf";
  std::fclose(std::fopen(empty.c_str(), "wb"));
  try {
    GgufFile::Open(empty);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  }
  const auto bytes = SampleFile();
  const std::string path = testing::TempDir() + "/sample.gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  const GgufFile file = GgufFile::Open(path);
  EXPECT_EQ(file.Dequantize(file.Tensor("w"))[7], 3.5f);
}

}  // namespace
}  // namespace amaq
