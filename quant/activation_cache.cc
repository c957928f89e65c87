#include "quant/activation_cache.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/base/error.h"

namespace amaq::quant {

ActivationCache::ActivationCache(uint64_t memory_limit_bytes, std::string spill_dir)
    : memory_limit_(memory_limit_bytes), spill_dir_(std::move(spill_dir)) {
  if (!spill_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(spill_dir_, ec);
    Require(!ec, ErrorCode::kFailedPrecondition,
            "cannot create the AQ-SGD spill directory '" + spill_dir_ + "': " + ec.message() +
                "; choose a writable directory");
  }
}

ActivationCache::~ActivationCache() {
  for (const auto& [id, entry] : entries_) {
    if (entry.on_disk) std::remove(SpillPath(id).c_str());
  }
}

std::string ActivationCache::SpillPath(uint64_t id) const {
  return spill_dir_ + "/sample-" + std::to_string(id) + ".f32";
}

void ActivationCache::Touch(uint64_t id, Entry& entry) {
  lru_.erase(entry.lru);
  lru_.push_front(id);
  entry.lru = lru_.begin();
}

std::vector<float>* ActivationCache::Find(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  Entry& entry = it->second;
  Touch(id, entry);
  if (entry.on_disk) {
    const std::string path = SpillPath(id);
    std::ifstream in(path, std::ios::binary);
    entry.values.resize(entry.bytes / sizeof(float));
    in.read(reinterpret_cast<char*>(entry.values.data()), static_cast<std::streamsize>(entry.bytes));
    Require(in.good(), ErrorCode::kDataLoss,
            "AQ-SGD spill file '" + path + "' is missing or short: the cache entry of sample " +
                std::to_string(id) + " is lost; restart the run's AQ-SGD warm-up");
    std::remove(path.c_str());
    entry.on_disk = false;
    stats_.disk_bytes -= entry.bytes;
    stats_.memory_bytes += entry.bytes;
    ++stats_.loads;
    EnforceLimit(id);
  }
  return &entry.values;
}

void ActivationCache::Insert(uint64_t id, std::vector<float> values) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    lru_.push_front(id);
    it = entries_.emplace(id, Entry{}).first;
    it->second.lru = lru_.begin();
    ++stats_.entries;
  } else {
    Entry& old = it->second;
    if (old.on_disk) {
      std::remove(SpillPath(id).c_str());
      stats_.disk_bytes -= old.bytes;
    } else {
      stats_.memory_bytes -= old.bytes;
    }
    Touch(id, old);
  }
  Entry& entry = it->second;
  entry.bytes = values.size() * sizeof(float);
  entry.values = std::move(values);
  entry.on_disk = false;
  stats_.memory_bytes += entry.bytes;
  EnforceLimit(id);
}

void ActivationCache::EnforceLimit(uint64_t keep) {
  auto victim = lru_.end();
  while (stats_.memory_bytes > memory_limit_ && victim != lru_.begin()) {
    --victim;
    Entry& entry = entries_.at(*victim);
    if (entry.on_disk || *victim == keep) continue;
    Require(!spill_dir_.empty(), ErrorCode::kResourceExhausted,
            "the AQ-SGD cache exceeds its memory limit of " + std::to_string(memory_limit_) +
                " bytes: raise the limit or give it a spill directory");
    const std::string path = SpillPath(*victim);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(entry.values.data()),
              static_cast<std::streamsize>(entry.bytes));
    out.close();
    Require(out.good(), ErrorCode::kResourceExhausted,
            "cannot write AQ-SGD spill file '" + path + "' (disk full or not writable): free "
            "space in the spill directory or raise the cache's memory limit");
    std::vector<float>().swap(entry.values);
    entry.on_disk = true;
    stats_.memory_bytes -= entry.bytes;
    stats_.disk_bytes += entry.bytes;
    ++stats_.spills;
  }
}

}  // namespace amaq::quant
