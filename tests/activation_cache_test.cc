// quant/activation_cache.h on its own: AQ-SGD's per-sample memory, its LRU spilling and limits.
#include "quant/activation_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/base/error.h"

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
  cache.Insert(7, {1, 2, 3});
  cache.Insert(9, {4});
  ASSERT_NE(cache.Find(7), nullptr);
  EXPECT_EQ(*cache.Find(7), (std::vector<float>{1, 2, 3}));
  cache.Insert(7, {5, 6});  // a replacement is one entry, of its new size
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
    cache.Insert(1, {1.5f, -2, 3, 4});
    cache.Insert(2, {5, 6, 7, 8});
    cache.Find(1);                       // 2 is now the least recently used
    cache.Insert(3, {9, 10, 11, 12.25f});  // spills 2
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
  cache.Insert(1, {1, 2, 3, 4});
  try {
    cache.Insert(2, {5, 6, 7, 8});
    ADD_FAILURE() << "the second entry exceeds the limit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("spill directory"), std::string::npos) << e.what();
  }
}

TEST(ActivationCache, ALostSpillFileIsReportedNotInvented) {
  const std::string dir = FreshDir("lost");
  ActivationCache cache(4 * sizeof(float), dir);
  cache.Insert(1, {1, 2, 3, 4});
  cache.Insert(2, {5, 6, 7, 8});  // spills 1
  std::filesystem::remove_all(dir);
  try {
    cache.Find(1);
    ADD_FAILURE() << "a missing spill file must not read as values";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
  }
}

// Save writes every entry with its tag, the spilled ones too without loading them into memory;
// Load gives them back exactly, within its own memory limit.
TEST(ActivationCache, SavedEntriesLoadBackWithTheirTags) {
  const std::string dir = FreshDir("save"), file = FreshDir("save-file");
  ActivationCache cache(2 * 4 * sizeof(float), dir);  // room for two entries of four floats
  EXPECT_FALSE(cache.changed());
  cache.Insert(1, {1.5f, -2, 3, 4}, 11);
  cache.Insert(2, {5, 6, 7, 8}, 22);
  cache.Insert(3, {9, 10, 11, 12.25f}, 33);  // spills 1
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
  EXPECT_EQ(loaded.TagOf(1), 11u);
  EXPECT_EQ(loaded.TagOf(2), 22u);
  EXPECT_EQ(loaded.TagOf(3), 33u);
  EXPECT_EQ(loaded.TagOf(4), std::nullopt);
  std::filesystem::remove(file);
}

// A damaged or truncated cache file is refused whole: nothing of it is taken.
TEST(ActivationCache, ADamagedFileLoadsNothing) {
  const std::string file = FreshDir("damaged");
  ActivationCache cache(1 << 20, "");
  cache.Insert(1, {1, 2, 3, 4}, 5);
  cache.Insert(2, {5, 6, 7, 8}, 6);
  cache.Save(file);
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
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

}  // namespace
}  // namespace amaq::quant
