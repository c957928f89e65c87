// ActivationCache: AQ-SGD's per-sample memory m(id), the last reconstructed activation of every
// training sample, on sender and receiver alike. Memory is bounded: past `memory_limit_bytes` the
// least recently used entries spill to files under `spill_dir` and are read back when their
// sample returns. Without a spill directory, exceeding the limit is an error. Entries stay
// bit-exact across spills (raw fp32 files).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

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
  ActivationCache(uint64_t memory_limit_bytes, std::string spill_dir);
  ~ActivationCache();  // removes its spill files
  ActivationCache(const ActivationCache&) = delete;
  ActivationCache& operator=(const ActivationCache&) = delete;

  bool Contains(uint64_t id) const { return entries_.count(id) != 0; }
  // The entry of `id`, read back from disk if it was spilled; nullptr when absent. The pointer is
  // valid until the next Find or Insert.
  std::vector<float>* Find(uint64_t id);
  // Adds or replaces the entry of `id`. Throws amaq::Error (kResourceExhausted) when the memory
  // limit is exceeded and nothing can be spilled.
  void Insert(uint64_t id, std::vector<float> values);
  CacheStats stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<float> values;  // empty while on disk
    uint64_t bytes = 0;
    bool on_disk = false;
    std::list<uint64_t>::iterator lru;
  };
  void Touch(uint64_t id, Entry& entry);
  void EnforceLimit(uint64_t keep);
  std::string SpillPath(uint64_t id) const;

  uint64_t memory_limit_;
  std::string spill_dir_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front = most recently used
  CacheStats stats_;
};

}  // namespace amaq::quant
