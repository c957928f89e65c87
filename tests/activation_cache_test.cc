// quant/activation_cache.h on its own: AQ-SGD's per-sample memory, its LRU spilling and limits.
#include "quant/activation_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

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

}  // namespace
}  // namespace amaq::quant
