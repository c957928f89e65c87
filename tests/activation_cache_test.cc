// quant/activation_cache.h on its own: AQ-SGD's per-sample memory, its LRU spilling and limits.
#include "quant/activation_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <iterator>

#include "common/base/error.h"
#include "quant/checksum.h"

namespace amaq::quant {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/amaq-cache-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

size_t FilesIn(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& file : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(ActivationCache, HoldsReplacesAndCountsEntries) {
  ActivationCache cache(1 << 20, "");
  EXPECT_FALSE(cache.Contains(7));
  EXPECT_EQ(cache.Find(7), nullptr);
  cache.Insert(7, {1, 2, 3}, 3);
  cache.Insert(9, {4}, 1);
  ASSERT_NE(cache.Find(7), nullptr);
  EXPECT_EQ(*cache.Find(7), (std::vector<float>{1, 2, 3}));
  cache.Insert(7, {5, 6}, 2);  // a replacement is one entry, of its new size
  EXPECT_EQ(*cache.Find(7), (std::vector<float>{5, 6}));
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(cache.stats().memory_bytes, 3 * sizeof(float));
}

// Past the limit the least recently used entries go to disk and come back exactly when their
// sample returns; the files are removed when read back and when the cache is destroyed.
TEST(ActivationCache, SpillsTheLeastRecentlyUsedAndReadsThemBackExactly) {
  const std::string dir = FreshDir("spill");
  {
    ActivationCache cache(2 * 4 * sizeof(float), dir);  // room for two entries of four floats
    cache.Insert(1, {1.5f, -2, 3, 4}, 2);
    cache.Insert(2, {5, 6, 7, 8}, 2);
    cache.Find(1);                       // 2 is now the least recently used
    cache.Insert(3, {9, 10, 11, 12.25f}, 2);  // spills 2
    EXPECT_EQ(cache.stats().spills, 1u);
    EXPECT_EQ(cache.stats().memory_bytes, 8 * sizeof(float));
    EXPECT_EQ(cache.stats().disk_bytes, 4 * sizeof(float));
    EXPECT_EQ(FilesIn(dir), 1u);
    EXPECT_TRUE(cache.Contains(2));
    EXPECT_EQ(*cache.Find(2), (std::vector<float>{5, 6, 7, 8}));  // back from disk, spilling 1
    EXPECT_EQ(cache.stats().loads, 1u);
    EXPECT_EQ(cache.stats().spills, 2u);
    EXPECT_EQ(*cache.Find(1), (std::vector<float>{1.5f, -2, 3, 4}));
    EXPECT_EQ(cache.stats().entries, 3u);
    EXPECT_EQ(FilesIn(dir), 1u);
  }
  EXPECT_EQ(FilesIn(dir), 0u) << "the destroyed cache left spill files";
}

TEST(ActivationCache, WithoutASpillDirectoryTheLimitIsAnError) {
  ActivationCache cache(4 * sizeof(float), "");
  cache.Insert(1, {1, 2, 3, 4}, 2);
  try {
    cache.Insert(2, {5, 6, 7, 8}, 2);
    ADD_FAILURE() << "the second entry exceeds the limit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("spill directory"), std::string::npos) << e.what();
  }
  // Refused before it is inserted (issue 41 item 5): an AQ-SGD receiver is not left ahead of its
  // sender, and a replacement that fits is still taken.
  EXPECT_FALSE(cache.Contains(2));
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.stats().memory_bytes, 4 * sizeof(float));
  EXPECT_EQ(*cache.Find(1), (std::vector<float>{1, 2, 3, 4}));
  cache.Insert(1, {9, 8, 7, 6}, 2);
  EXPECT_EQ(*cache.Find(1), (std::vector<float>{9, 8, 7, 6}));
  EXPECT_THROW(cache.Insert(3, std::vector<float>(8, 1.0f), 2), Error) << "an entry larger than the limit alone";
}

TEST(ActivationCache, ALostSpillFileIsReportedNotInvented) {
  const std::string dir = FreshDir("lost");
  ActivationCache cache(4 * sizeof(float), dir);
  cache.Insert(1, {1, 2, 3, 4}, 2);
  cache.Insert(2, {5, 6, 7, 8}, 2);  // spills 1
  std::filesystem::remove_all(dir);
  try {
    cache.Find(1);
    ADD_FAILURE() << "a missing spill file must not read as values";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  }
}

// Save writes every entry with its tag and shape, the spilled ones too without loading them into memory;
// Load gives them back exactly, within its own memory limit.
TEST(ActivationCache, SavedEntriesLoadBackWithTheirTags) {
  const std::string dir = FreshDir("save"), file = FreshDir("save-file");
  ActivationCache cache(2 * 4 * sizeof(float), dir);  // room for two entries of four floats
  EXPECT_FALSE(cache.changed());
  cache.Insert(1, {1.5f, -2, 3, 4}, 2, 11);
  cache.Insert(2, {5, 6, 7, 8}, 2, 22);
  cache.Insert(3, {9, 10, 11, 12.25f}, 2, 33);  // spills 1
  ASSERT_EQ(cache.stats().spills, 1u);
  EXPECT_TRUE(cache.changed());
  cache.Save(file);
  EXPECT_FALSE(cache.changed());
  EXPECT_EQ(cache.stats().loads, 0u) << "saving read a spilled entry into memory";
  EXPECT_EQ(cache.stats().memory_bytes, 8 * sizeof(float));

  ActivationCache loaded(1 << 20, "");
  loaded.Load(file);
  EXPECT_FALSE(loaded.changed());
  EXPECT_EQ(loaded.stats().entries, 3u);
  EXPECT_EQ(*loaded.Find(1), (std::vector<float>{1.5f, -2, 3, 4}));
  EXPECT_EQ(*loaded.Find(3), (std::vector<float>{9, 10, 11, 12.25f}));
  EXPECT_EQ(loaded.Describe(1)->tag, 11u);
  EXPECT_EQ(loaded.Describe(2)->tag, 22u);
  EXPECT_EQ(loaded.Describe(3)->tag, 33u);
  EXPECT_EQ(loaded.Describe(3)->rows, 2);
  EXPECT_EQ(loaded.Describe(3)->cols, 2) << "an entry comes back with its shape";
  EXPECT_EQ(loaded.Describe(4), std::nullopt);
  std::filesystem::remove(file);
}

// Saves a cache of two entries of four values (2 x 2, and the second `second_cols` wide) to `file`
// and returns the file's bytes.
std::string SaveTwoEntries(const std::string& file, int64_t second_cols) {
  ActivationCache cache(1 << 20, "");
  cache.Insert(1, {1, 2, 3, 4}, 2, 5);
  cache.Insert(2, {5, 6, 7, 8}, second_cols, 6);
  cache.Save(file);
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A damaged or truncated cache file is refused whole: nothing of it is taken.
TEST(ActivationCache, ADamagedFileLoadsNothing) {
  const std::string file = FreshDir("damaged");
  const std::string bytes = SaveTwoEntries(file, 2);
  const auto write = [&](const std::string& b) { std::ofstream(file, std::ios::binary | std::ios::trunc) << b; };
  for (size_t at : {size_t{0}, size_t{13}, size_t{30}, bytes.size() - 9}) {
    std::string damaged = bytes;
    damaged[at] ^= 0x40;
    write(damaged);
    ActivationCache loaded(1 << 20, "");
    EXPECT_THROW(loaded.Load(file), Error) << "byte " << at;
    EXPECT_EQ(loaded.stats().entries, 0u) << "byte " << at;
  }
  write(bytes.substr(0, bytes.size() - 20));
  ActivationCache truncated(1 << 20, "");
  try {
    truncated.Load(file);
    ADD_FAILURE() << "a truncated file must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
  }
  EXPECT_EQ(truncated.stats().entries, 0u);
  std::filesystem::remove(file);
}

// docs/wire-format.md, "AQ-SGD cache file": each entry is rows x cols (both positive) of finite
// values and a sample appears once; a well-sealed file that breaks a rule is refused whole.
TEST(ActivationCache, AFileWithARepeatedSampleAnEntryWithoutRowsOrAValueNotFiniteLoadsNothing) {
  const std::string file = FreshDir("rules");
  const std::string bytes = SaveTwoEntries(file, 4);
  constexpr size_t kHeader = 4 + 1 + 8, kEntry = 8 + 8 + 8 + 8 + 4 * sizeof(float);
  ASSERT_EQ(bytes.size(), kHeader + 2 * kEntry + 8);
  // Writes the file with the u64 fields at the given offsets patched, sealed again as a writer
  // with that content would.
  const auto write_patched = [&](const std::vector<std::pair<size_t, uint64_t>>& patches) {
    std::string b = bytes;
    for (const auto& [at, value] : patches) std::memcpy(b.data() + at, &value, 8);
    const uint64_t digest = WireChecksum(reinterpret_cast<const uint8_t*>(b.data()), b.size() - 8);
    std::memcpy(b.data() + b.size() - 8, &digest, 8);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << b;
  };
  uint64_t first_id;
  std::memcpy(&first_id, bytes.data() + kHeader, 8);
  const size_t rows_at = kHeader + 16, cols_at = kHeader + 24;  // of the first entry
  const std::pair<size_t, uint64_t> breaks[] = {
      {kHeader + kEntry, first_id},  // the second entry's id is the first's
      {rows_at, 0},                  // the first entry has no rows
      {cols_at, 0},                  // ...or no columns
      {kHeader + 32, 0x400000007f800000},  // its first value is infinite (the second stays 2)
      {kHeader + 32, 0x400000007fc00000},  // ...or NaN
  };
  for (const auto& patch : breaks) {
    write_patched({patch});
    ActivationCache loaded(1 << 20, "");
    try {
      loaded.Load(file);
      ADD_FAILURE() << "byte " << patch.first << " = " << patch.second << " must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
    }
    EXPECT_EQ(loaded.stats().entries, 0u);
  }
  write_patched({{rows_at, 4}, {cols_at, 1}});  // 4 x 1: another shape of the same values, well formed
  ActivationCache reshaped(1 << 20, "");
  reshaped.Load(file);
  EXPECT_EQ(reshaped.Describe(first_id)->rows, 4);
  EXPECT_EQ(reshaped.Describe(first_id)->cols, 1);
  std::filesystem::remove(file);
}

TEST(ActivationCache, AnEntryIsAMatrix) {
  ActivationCache cache(1 << 20, "");
  EXPECT_THROW(cache.Insert(1, {1, 2, 3}, 2), Error);
  EXPECT_THROW(cache.Insert(1, {1, 2}, 0), Error);
  EXPECT_FALSE(cache.Contains(1));
}

}  // namespace
}  // namespace amaq::quant
