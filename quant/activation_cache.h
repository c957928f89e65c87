// ActivationCache: AQ-SGD's per-sample memory m(id), the last reconstructed activation of every
// training sample, on sender and receiver alike. Memory is bounded: past `memory_limit_bytes` the
// least recently used entries spill to files under `spill_dir` and are read back when their
// sample returns. Without a spill directory, exceeding the limit is an error. Entries stay
// bit-exact across spills (raw fp32 files). Each entry is a [rows, cols] matrix and carries a tag
// naming what set it (AQ-SGD: the frame), so that two caches can tell which of their entries agree
// and a delta is only ever added to an entry of its own shape.
//
// Save writes every entry, with its tag, to one file (docs/wire-format.md, "AQ-SGD cache file"),
// atomically and without loading the spilled ones into memory; Load reads such a file into an
// empty cache. Both leave the file and the cache consistent on every error. Every file goes
// through the cache's Env (common/base/env.h; not owned, must outlive the cache).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/env.h"

namespace amaq::quant {

struct CacheStats {
  uint64_t entries = 0;       // samples held, in memory or on disk
  uint64_t memory_bytes = 0;  // bytes of entries in memory
  uint64_t disk_bytes = 0;    // bytes of entries spilled to disk
  uint64_t spills = 0;        // entries written to disk so far
  uint64_t loads = 0;         // entries read back from disk so far
};

class ActivationCache {
 public:
  ActivationCache(uint64_t memory_limit_bytes, std::string spill_dir, Env* env = Env::Default());
  ~ActivationCache();  // removes its spill files
  ActivationCache(const ActivationCache&) = delete;
  ActivationCache& operator=(const ActivationCache&) = delete;

  // What the cache knows of an entry besides its values.
  struct Held {
    uint64_t tag = 0;
    int64_t rows = 0, cols = 0;
  };

  bool Contains(uint64_t id) const { return entries_.count(id) != 0; }
  // The tag and shape of the entry of `id`; nullopt when absent.
  std::optional<Held> Describe(uint64_t id) const;
  // The entry of `id`, read back from disk if it was spilled; nullptr when absent. The pointer is
  // valid until the next Find or Insert.
  std::vector<float>* Find(uint64_t id);
  // Adds or replaces the entry of `id`: `values` is [values.size() / cols, cols], tagged `tag`.
  // Throws amaq::Error: kInvalidArgument when cols is not positive or does not divide the values,
  // kResourceExhausted when a spill file cannot be written, or, without a spill directory, when
  // the entry would take the cache past its memory limit (then refused before anything changes).
  void Insert(uint64_t id, std::vector<float> values, int64_t cols, uint64_t tag = 0);
  CacheStats stats() const { return stats_; }

  // Whether an Insert happened since the last Save or Load (a fresh cache has none).
  bool changed() const { return changed_; }
  // Writes every entry to `path` atomically. Throws amaq::Error when it cannot (the old file stays).
  void Save(const std::string& path);
  // Fills this empty cache with the entries of `path`. Throws amaq::Error: kNotFound when there is
  // no such file, kDataLoss when it is malformed (the cache stays empty), kResourceExhausted as
  // Insert (the cache then holds some of the file's entries).
  void Load(const std::string& path);

 private:
  struct Entry {
    std::vector<float> values;  // empty while on disk
    uint64_t bytes = 0;
    uint64_t tag = 0;
    int64_t cols = 0;
    bool on_disk = false;
    std::list<uint64_t>::iterator lru;
  };
  void ReadSpilled(uint64_t id, const Entry& entry, std::vector<float>* values) const;
  void Touch(uint64_t id, Entry& entry);
  void EnforceLimit(uint64_t keep);
  std::string SpillPath(uint64_t id) const;

  uint64_t memory_limit_;
  std::string spill_dir_;
  Env* env_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front = most recently used
  CacheStats stats_;
  bool changed_ = false;
};

}  // namespace amaq::quant
