#include "quant/aqsgd.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "aqsgd_frames.h"
#include "common/base/error.h"
#include "quant/checksum.h"
#include "test_tensors.h"

namespace amaq::quant {
namespace {

constexpr int64_t kSamples = 16, kRows = 8, kCols = 32;

double Mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return s / static_cast<double>(a.size());
}

std::vector<uint64_t> Ids() {
  std::vector<uint64_t> ids(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) ids[i] = 1000 + static_cast<uint64_t>(i) * 7;
  return ids;
}

// Activations of the same samples drift slowly between epochs, as they do while fine-tuning.
std::vector<float> Drift(const std::vector<float>& x, float amount, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, amount);
  std::vector<float> y = x;
  for (auto& v : y) v += noise(rng);
  return y;
}

TEST(Aqsgd, SecondVisitSendsSmallerErrorThanPlainQuantization) {
  AqsgdOptions options;
  options.bits = 4;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto ids = Ids();
  const auto epoch1 = testing::GaussianTensor(kSamples * kRows, kCols, 1);
  const auto epoch2 = Drift(epoch1, 0.05f, 2);

  std::vector<float> sent1(epoch1.size()), sent2(epoch2.size());
  const Encoded first = sender.Encode(epoch1.data(), ids, kRows, kCols, sent1.data());
  const Encoded second = sender.Encode(epoch2.data(), ids, kRows, kCols, sent2.data());
  EXPECT_EQ(receiver.Decode(first.bytes.data(), first.bytes.size()).values, sent1);
  const AqsgdDecoded got = receiver.Decode(second.bytes.data(), second.bytes.size());
  EXPECT_EQ(got.values, sent2) << "receiver and sender caches must stay bit-identical";
  EXPECT_EQ(got.ids, ids);

  // Plain per-channel symmetric quantization at the same 4 bits, for comparison.
  EncodeOptions plain;
  plain.scheme = Scheme::kSymmetric;
  std::vector<float> plain_hat(epoch2.size());
  Encoder().Encode(epoch2.data(), kSamples * kRows, kCols, BitsTable::Uniform(4), plain,
                   plain_hat.data());
  const double aqsgd_error = Mse(epoch2, sent2), plain_error = Mse(epoch2, plain_hat);
  EXPECT_LT(aqsgd_error, plain_error / 10) << "aqsgd " << aqsgd_error << " plain " << plain_error;
  // Warm-up in bf16 costs 16 bits per value; later visits 4.
  EXPECT_DOUBLE_EQ(first.average_bits, 16.0);
  EXPECT_DOUBLE_EQ(second.average_bits, 4.0);
  EXPECT_LT(second.count.total(), first.count.total() / 3);
}

TEST(Aqsgd, MixedBatchOfNewAndSeenSamples) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(4 * kRows, kCols, 3);
  std::vector<float> hat(x.size());
  const Encoded a = sender.Encode(x.data(), {1, 2, 3, 4}, kRows, kCols, hat.data());
  receiver.Decode(a.bytes.data(), a.bytes.size());
  const auto y = Drift(x, 0.1f, 4);
  const Encoded b = sender.Encode(y.data(), {3, 9, 1, 8}, kRows, kCols, hat.data());
  const AqsgdDecoded got = receiver.Decode(b.bytes.data(), b.bytes.size());
  EXPECT_EQ(got.values, hat);
  EXPECT_EQ(sender.cache_stats().entries, 6u);
  EXPECT_EQ(receiver.cache_stats().entries, 6u);
  EXPECT_EQ(sender.cache_stats().memory_bytes, 6u * kRows * kCols * sizeof(float));
}

TEST(Aqsgd, CacheSpillsToDiskAndStaysExact) {
  const std::string dir = ::testing::TempDir() + "/aqsgd-spill-" + std::to_string(getpid());
  AqsgdOptions options;
  options.cache_memory_bytes = 3 * kRows * kCols * sizeof(float);  // three samples in memory
  options.spill_dir = dir + "/sender";
  AqsgdSender sender(options);
  options.spill_dir = dir + "/receiver";
  AqsgdReceiver receiver(options);
  const auto ids = Ids();
  auto x = testing::GaussianTensor(kSamples * kRows, kCols, 5);
  std::vector<float> hat(x.size());
  for (int epoch = 0; epoch < 3; ++epoch) {
    const Encoded e = sender.Encode(x.data(), ids, kRows, kCols, hat.data());
    ASSERT_EQ(receiver.Decode(e.bytes.data(), e.bytes.size()).values, hat) << "epoch " << epoch;
    x = Drift(x, 0.05f, 10 + epoch);
  }
  const CacheStats stats = sender.cache_stats();
  EXPECT_EQ(stats.entries, static_cast<uint64_t>(kSamples));
  EXPECT_LE(stats.memory_bytes, options.cache_memory_bytes);
  EXPECT_GT(stats.spills, 0u);
  EXPECT_GT(stats.loads, 0u);
  EXPECT_EQ(stats.memory_bytes + stats.disk_bytes, kSamples * kRows * kCols * sizeof(float));
  std::filesystem::remove_all(dir);
}

TEST(Aqsgd, HardMemoryLimitWithoutSpillDirectory) {
  AqsgdOptions options;
  options.cache_memory_bytes = kRows * kCols * sizeof(float);  // one sample
  AqsgdSender sender(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 6);
  try {
    sender.Encode(x.data(), {1, 2}, kRows, kCols);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
  }
}

TEST(Aqsgd, RestartedReceiverRefusesDeltasWithoutChangingState) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 7);
  sender.Encode(x.data(), {1, 2}, kRows, kCols);
  const Encoded delta = sender.Encode(x.data(), {1, 2}, kRows, kCols);
  AqsgdReceiver restarted(options);
  try {
    restarted.Decode(delta.bytes.data(), delta.bytes.size());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
  }
  EXPECT_EQ(restarted.cache_stats().entries, 0u);
}

TEST(Aqsgd, MalformedFramesAreRefused) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 8);
  const Encoded e = sender.Encode(x.data(), {1, 2}, kRows, kCols);
  for (size_t n = 0; n < e.bytes.size(); n += 7) {
    AqsgdReceiver receiver(options);
    EXPECT_THROW(receiver.Decode(e.bytes.data(), n), Error) << "length " << n;
    EXPECT_EQ(receiver.cache_stats().entries, 0u);
  }
  for (size_t i = 0; i < e.bytes.size(); i += 5) {
    std::vector<uint8_t> b = e.bytes;
    b[i] ^= 0x21;
    AqsgdReceiver receiver(options);
    EXPECT_THROW(receiver.Decode(b.data(), b.size()), Error) << "byte " << i;
  }
  EXPECT_THROW(sender.Encode(x.data(), {5, 5}, kRows, kCols), Error);  // repeated id
}

// A receiver restored from an older copy of its cache holds other entries than the sender: a delta
// on one of them is refused with the cache as it was, the step sent again in full is taken, and
// from then on the two caches agree bit for bit. Entries both sides still share go on as deltas.
TEST(Aqsgd, ADeltaOnAnotherEntryThanTheReceiversIsRefusedAndTheStepComesAgainInFull) {
  const std::string file = ::testing::TempDir() + "/aqsgd-history-" + std::to_string(getpid());
  AqsgdOptions options;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 11);
  for (const std::vector<uint64_t>& ids : {std::vector<uint64_t>{1, 2}, std::vector<uint64_t>{3, 4}}) {
    const Encoded e = sender.Encode(x.data(), ids, kRows, kCols);
    receiver.Decode(e.bytes.data(), e.bytes.size());
  }
  receiver.cache().Save(file);  // the receiver's checkpoint
  const Encoded lost = sender.Encode(Drift(x, 0.1f, 12).data(), {1, 2}, kRows, kCols);
  receiver.Decode(lost.bytes.data(), lost.bytes.size());
  AqsgdReceiver restored(options);
  restored.cache().Load(file);

  const std::vector<float> held = *restored.cache().Find(1);
  const std::optional<uint64_t> held_tag = restored.cache().Describe(1)->tag;
  const auto y = Drift(x, 0.1f, 13);
  const Encoded refused = sender.Encode(y.data(), {1, 2}, kRows, kCols);
  try {
    restored.Decode(refused.bytes.data(), refused.bytes.size());
    ADD_FAILURE() << "a delta on an entry the receiver lost must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << e.what();
  }
  EXPECT_EQ(*restored.cache().Find(1), held) << "the refused frame changed the cache";
  EXPECT_EQ(restored.cache().Describe(1)->tag, held_tag);
  std::vector<float> hat(y.size());
  const Encoded full = sender.Encode(y.data(), {1, 2}, kRows, kCols, hat.data(), /*in_full=*/true);
  EXPECT_DOUBLE_EQ(full.average_bits, 16.0);
  EXPECT_EQ(restored.Decode(full.bytes.data(), full.bytes.size()).values, hat);
  const auto z = Drift(y, 0.1f, 14);
  const Encoded after = sender.Encode(z.data(), {2, 3}, kRows, kCols, hat.data());  // 3: an entry from the checkpoint
  EXPECT_DOUBLE_EQ(after.average_bits, 4.0);
  EXPECT_EQ(restored.Decode(after.bytes.data(), after.bytes.size()).values, hat);
  std::filesystem::remove(file);
}

// A frame decoded a second time (a retry the server already took) gives the same values and leaves
// the entries it set as they were: its deltas are not added twice.
TEST(Aqsgd, AFrameDecodedAgainChangesNothing) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 15);
  const Encoded first = sender.Encode(x.data(), {1, 2}, kRows, kCols);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  std::vector<float> hat(x.size());
  const Encoded delta = sender.Encode(Drift(x, 0.1f, 16).data(), {1, 2}, kRows, kCols, hat.data());
  EXPECT_EQ(receiver.Decode(delta.bytes.data(), delta.bytes.size()).values, hat);
  EXPECT_EQ(receiver.Decode(delta.bytes.data(), delta.bytes.size()).values, hat) << "decoded again";
  const Encoded next = sender.Encode(x.data(), {1, 2}, kRows, kCols, hat.data());
  EXPECT_EQ(receiver.Decode(next.bytes.data(), next.bytes.size()).values, hat) << "the caches still agree";
}

// Where an AQ-SGD frame's delta part starts (its 8-byte size field), for a frame of `samples`.
size_t DeltaPartAt(const std::vector<uint8_t>& frame, size_t samples) {
  const size_t header = 4 + 1 + 4 + 8 + 8 + 17 * samples + 8;
  uint64_t full_size;
  std::memcpy(&full_size, frame.data() + header, 8);
  return header + 8 + full_size;
}

// The frame with its delta part replaced by `part`, a tensor message.
std::vector<uint8_t> WithDeltaPart(const std::vector<uint8_t>& frame, size_t samples, const std::vector<uint8_t>& part) {
  std::vector<uint8_t> b(frame.begin(), frame.begin() + static_cast<long>(DeltaPartAt(frame, samples)));
  const uint64_t size = part.size();
  b.insert(b.end(), reinterpret_cast<const uint8_t*>(&size), reinterpret_cast<const uint8_t*>(&size) + 8);
  b.insert(b.end(), part.begin(), part.end());
  return b;
}

// The parts are what docs/wire-format.md fixes: a float full part, a symmetric per-channel delta
// part with one width, each of exactly its samples' rows and the frame's columns (an empty part
// too); anything else is refused and the cache is left as it was.
TEST(Aqsgd, PartsOfAnotherKindOrShapeAreRefused) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 8);
  const Encoded first = sender.Encode(x.data(), {1, 2}, kRows, kCols);  // both full: the delta part is empty
  AqsgdReceiver receiver(options);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  const Encoded second = sender.Encode(x.data(), {1, 2}, kRows, kCols);  // both delta
  const std::vector<uint8_t> delta(second.bytes.begin() + static_cast<long>(DeltaPartAt(second.bytes, 2) + 8), second.bytes.end());
  EXPECT_EQ(WithDeltaPart(second.bytes, 2, delta), second.bytes) << "the helper rebuilds a frame as it was";
  EncodeOptions affine;
  std::vector<uint8_t> frame = WithDeltaPart(
      second.bytes, 2, Encoder().Encode(x.data(), 2 * kRows, kCols, BitsTable::Uniform(4), affine).bytes);
  EXPECT_THROW(receiver.Decode(frame.data(), frame.size()), Error) << "an affine delta part";
  EncodeOptions symmetric;
  symmetric.scheme = Scheme::kSymmetric;
  std::vector<uint8_t> widths(kCols, 4);
  frame = WithDeltaPart(second.bytes, 2,
                        Encoder().Encode(x.data(), 2 * kRows, kCols, BitsTable::PerChannel(widths), symmetric).bytes);
  EXPECT_THROW(receiver.Decode(frame.data(), frame.size()), Error) << "a delta part with a width per channel";
  frame = WithDeltaPart(first.bytes, 2, Encoder().Encode(x.data(), 0, kCols + 1, BitsTable::Uniform(4), symmetric).bytes);
  EXPECT_THROW(receiver.Decode(frame.data(), frame.size()), Error) << "an empty part of other columns";
  EXPECT_EQ(receiver.cache_stats().entries, 2u);
  EXPECT_NO_THROW(receiver.Decode(second.bytes.data(), second.bytes.size()));
}

// A delta whose base tag names a held entry but whose rows or columns differ from that entry (a
// hostile peer, or a cache saved under other settings) is refused as a base not held, and the
// entry stays as it was; the same frame with the entry's own shape is taken, so the refusals are
// about the shape. (Before, the longer ones read past the entry's buffer.)
TEST(Aqsgd, ADeltaOnAHeldEntryOfAnotherShapeIsRefusedWithTheCacheUnchanged) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(2 * kRows, kCols, 21);
  const Encoded first = sender.Encode(x.data(), {1}, kRows, kCols);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  const uint64_t tag = WireChecksum(first.bytes.data(), first.bytes.size());
  ASSERT_EQ(receiver.cache().Describe(1)->tag, tag);
  const std::vector<float> held = *receiver.cache().Find(1);
  const std::pair<int64_t, int64_t> shapes[] = {
      {2 * kRows, kCols}, {kRows, kCols + 3}, {kRows / 2, kCols * 2}, {1, 1}};  // longer, wider, equal size, shorter
  for (const auto& [rows, cols] : shapes) {
    const std::vector<uint8_t> frame = testing::DeltaFrameOn(tag, {1}, rows, cols, x.data());
    try {
      receiver.Decode(frame.data(), frame.size());
      ADD_FAILURE() << rows << " x " << cols << ": a delta on an entry of another shape must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << e.what();
      EXPECT_NE(std::string(e.what()).find("shape changed"), std::string::npos) << e.what();
    }
    EXPECT_EQ(*receiver.cache().Find(1), held) << rows << " x " << cols;
    EXPECT_EQ(receiver.cache().Describe(1)->tag, tag);
  }
  const std::vector<uint8_t> own = testing::DeltaFrameOn(tag, {1}, kRows, kCols, x.data());
  EXPECT_NO_THROW(receiver.Decode(own.data(), own.size())) << "the hand-made frame is valid at the entry's shape";
}

// A sample whose shape changed since it last crossed (rows 1 -> 2, columns 3 -> 5) goes in full,
// and the receiver gets what the sender holds; at the same shape again it goes as a delta. (Before,
// the sender read past its entry and the receiver got 1.86 and 0 for 2.0.)
TEST(Aqsgd, ASampleWhoseShapeChangedIsSentInFull) {
  AqsgdOptions options;
  options.warmup_scheme = Scheme::kFloat32;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const std::vector<float> small(3, 1.0f), large(10, 2.0f);
  const Encoded first = sender.Encode(small.data(), {1}, 1, 3);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  std::vector<float> hat(large.size());
  const Encoded grown = sender.Encode(large.data(), {1}, 2, 5, hat.data());
  EXPECT_DOUBLE_EQ(grown.average_bits, 32.0) << "sent in full";
  EXPECT_EQ(hat, large);
  EXPECT_EQ(receiver.Decode(grown.bytes.data(), grown.bytes.size()).values, large);
  const Encoded again = sender.Encode(large.data(), {1}, 2, 5, hat.data());
  EXPECT_DOUBLE_EQ(again.average_bits, 4.0) << "the same shape again is a delta";
  EXPECT_EQ(receiver.Decode(again.bytes.data(), again.bytes.size()).values, hat);
  EXPECT_EQ(receiver.cache().Describe(1)->rows, 2);
  EXPECT_EQ(receiver.cache().Describe(1)->cols, 5);
}

// What the sender writes, the receiver takes: a delta from 6e4 to 1e38 decodes at 4 bits (the
// decoder used to check every group against 255 steps, which overflows fp32 whatever the width).
// A sample beyond 1e38 goes in full (its delta's grid could decode beyond fp32: 14 steps of 3e38 /
// 7), and so does the next one after it, whose entry is beyond 1e38; both sides hold the same.
TEST(Aqsgd, ASampleNearFp32sLimitGoesAsADeltaAndBeyondItInFull) {
  AqsgdOptions options;
  options.warmup_scheme = Scheme::kFloat32;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const std::vector<float> before(4, 6e4f), after(4, 1e38f), beyond(4, 3e38f), back(4, -1.0f);
  const Encoded first = sender.Encode(before.data(), {1}, 1, 4);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  std::vector<float> hat(after.size());
  const Encoded delta = sender.Encode(after.data(), {1}, 1, 4, hat.data());
  EXPECT_DOUBLE_EQ(delta.average_bits, 4.0);
  EXPECT_EQ(receiver.Decode(delta.bytes.data(), delta.bytes.size()).values, hat);
  for (const std::vector<float>* x : {&beyond, &back}) {
    const Encoded full = sender.Encode(x->data(), {1}, 1, 4, hat.data());
    EXPECT_DOUBLE_EQ(full.average_bits, 32.0) << (*x)[0] << " after " << (x == &back ? "3e38" : "1e38") << " goes in full";
    EXPECT_EQ(hat, *x);
    EXPECT_EQ(receiver.Decode(full.bytes.data(), full.bytes.size()).values, *x);
  }
  EXPECT_EQ(*receiver.cache().Find(1), *sender.cache().Find(1));
}

// Every value a frame decodes to is finite (docs/wire-format.md): a delta that an honest sender
// would not write, which takes an entry of 3e38 beyond fp32's range, is a malformed frame, and the
// receiver's cache stays as it was, that of the other sample of the frame included.
TEST(Aqsgd, ADeltaThatWouldDecodeBeyondFp32IsRefused) {
  AqsgdOptions options;
  options.warmup_scheme = Scheme::kFloat32;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const std::vector<float> entries = {1.0f, 1.0f, 3e38f, 3e38f};
  const Encoded first = sender.Encode(entries.data(), {1, 2}, 1, 2);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  const uint64_t tag = WireChecksum(first.bytes.data(), first.bytes.size());
  const std::vector<float> deltas = {1.0f, 1.0f, 1e38f, 1e38f};
  const std::vector<uint8_t> frame = testing::DeltaFrameOn(tag, {1, 2}, 1, 2, deltas.data());
  try {
    receiver.Decode(frame.data(), frame.size());
    ADD_FAILURE() << "3e38 + 1e38 is not finite";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
    EXPECT_NE(std::string(e.what()).find("beyond fp32's range"), std::string::npos) << e.what();
  }
  EXPECT_EQ(*receiver.cache().Find(1), std::vector<float>(2, 1.0f)) << "sample 1's delta was valid, but the frame was not";
  EXPECT_EQ(receiver.cache().Describe(1)->tag, tag);
  EXPECT_EQ(*receiver.cache().Find(2), std::vector<float>(2, 3e38f));
}

// A delta part that refers to its stream's bits table instead of carrying it (a tensor message
// alone would get FAILED_PRECONDITION) is a malformed frame: DATA_LOSS, as the format says of any
// error inside a part, so that no sender resends the step in full over a corrupt frame.
TEST(Aqsgd, APartThatRefersToATableIsDataLoss) {
  AqsgdOptions options;
  AqsgdSender sender(options);
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(kRows, kCols, 23);
  const Encoded first = sender.Encode(x.data(), {1}, kRows, kCols);
  receiver.Decode(first.bytes.data(), first.bytes.size());
  const uint64_t tag = WireChecksum(first.bytes.data(), first.bytes.size());
  std::vector<uint8_t> frame = testing::DeltaFrameOn(tag, {1}, kRows, kCols, x.data());
  // The delta part again from an encoder that sent the same table before: it refers to it.
  EncodeOptions delta;
  delta.scheme = Scheme::kSymmetric;
  Encoder encoder;
  encoder.Encode(x.data(), kRows, kCols, BitsTable::Uniform(4), delta);
  const Encoded referring = encoder.Encode(x.data(), kRows, kCols, BitsTable::Uniform(4), delta);
  const Encoded carrying = Encoder().Encode(x.data(), kRows, kCols, BitsTable::Uniform(4), delta);
  ASSERT_EQ(carrying.bytes.size(), referring.bytes.size() + 1) << "one table entry fewer";
  frame.resize(frame.size() - carrying.bytes.size() - 8);
  ByteWriter w(&frame);
  w.Put(static_cast<uint64_t>(referring.bytes.size()));
  w.PutBytes(referring.bytes.data(), referring.bytes.size());
  try {
    receiver.Decode(frame.data(), frame.size());
    ADD_FAILURE() << "a part must carry its table";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
  }
}

// The codes aqsgd.h promises: a frame whose samples have no rows or no columns, or whose part does
// not fit its sample list, is malformed (kDataLoss), not an argument or a limit.
TEST(Aqsgd, MalformedShapesAreDataLoss) {
  AqsgdOptions options;
  AqsgdReceiver receiver(options);
  const auto x = testing::GaussianTensor(kRows, kCols, 22);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{0, kCols}, {kRows, 0}}) {
    const std::vector<uint8_t> frame = testing::DeltaFrameOn(7, {1}, rows, cols, x.data());
    try {
      receiver.Decode(frame.data(), frame.size());
      ADD_FAILURE() << rows << " x " << cols;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
    }
  }
  AqsgdSender sender(options);
  const Encoded first = sender.Encode(x.data(), {1}, kRows, kCols);
  EncodeOptions symmetric;
  symmetric.scheme = Scheme::kSymmetric;
  // Its one sample is full, so its delta part has no rows: one of kRows - 1 rows does not fit.
  const std::vector<uint8_t> frame = WithDeltaPart(
      first.bytes, 1, Encoder().Encode(x.data(), kRows - 1, kCols, BitsTable::Uniform(4), symmetric).bytes);
  try {
    receiver.Decode(frame.data(), frame.size());
    ADD_FAILURE() << "a part of other rows than its samples";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
  }
  EXPECT_EQ(receiver.cache_stats().entries, 0u);
}

}  // namespace
}  // namespace amaq::quant
