#include "quant/activation_cache.h"

#include <algorithm>
#include <cmath>

#include <functional>
#include <unordered_set>

#include "common/base/atomic_file.h"
#include "common/base/error.h"
#include "quant/checksum.h"

namespace amaq::quant {
namespace {

// Reads `size` bytes of `file` into `out`; false when the file ends first.
bool ReadFully(SequentialFile& file, void* out, uint64_t size) {
  char* p = static_cast<char*>(out);
  for (size_t n; size > 0; p += n, size -= n) {
    if ((n = file.Read(p, size)) == 0) return false;
  }
  return true;
}

constexpr uint32_t kFileMagic = 0x43535141;  // "AQSC"
constexpr uint8_t kFileVersion = 2;

// Reads a cache file front to back, checking each read against the file's end and hashing it.
class CacheFileReader {
 public:
  CacheFileReader(Env& env, const std::string& path) : path_(path) {
    try {
      left_ = env.FileSize(path);
      in_ = env.NewSequentialFile(path);
    } catch (const Error& e) {
      throw Error(ErrorCode::kNotFound, "AQ-SGD cache file '" + path + "' cannot be read: " + e.what());
    }
  }
  template <typename T>
  T Get() {
    T value;
    Read(&value, sizeof value);
    return value;
  }
  void Read(void* out, uint64_t size) {
    Require(size <= left_, ErrorCode::kDataLoss, Malformed("it ends early"));
    Require(ReadFully(*in_, out, size), ErrorCode::kDataLoss, Malformed("it could not be read to its end"));
    hash_.Update(out, size);
    left_ -= size;
  }
  uint64_t left() const { return left_; }
  uint64_t digest() const { return hash_.Digest(); }
  std::string Malformed(const std::string& why) const {
    return "AQ-SGD cache file '" + path_ + "' is malformed (" + why + "): delete it; the cache then fills again";
  }

 private:
  std::string path_;
  std::unique_ptr<SequentialFile> in_;
  uint64_t left_ = 0;
  WireChecksumStream hash_;
};

// One entry of a cache file: its id, tag, row width and values.
struct FileEntry {
  uint64_t id = 0, tag = 0;
  int64_t cols = 0;
  std::vector<float> values;
};

// Reads the file's entries in order, checking its header and shape as it goes and its checksum at
// the end: `take` gets each entry as it is read, so a caller that must not act on a corrupted file
// reads it twice.
void ReadCacheFile(Env& env, const std::string& path, const std::function<void(FileEntry&)>& take) {
  CacheFileReader r(env, path);
  Require(r.Get<uint32_t>() == kFileMagic && r.Get<uint8_t>() == kFileVersion, ErrorCode::kDataLoss,
          r.Malformed("not an AQ-SGD cache file of version " + std::to_string(kFileVersion)));
  const auto entries = r.Get<uint64_t>();
  std::unordered_set<uint64_t> ids;
  FileEntry e;
  for (uint64_t i = 0; i < entries; ++i) {
    e.id = r.Get<uint64_t>();
    e.tag = r.Get<uint64_t>();
    const auto rows = r.Get<uint64_t>();
    const auto cols = r.Get<uint64_t>();
    Require(ids.insert(e.id).second, ErrorCode::kDataLoss, r.Malformed("sample " + std::to_string(e.id) + " appears twice"));
    Require(rows > 0 && cols > 0, ErrorCode::kDataLoss, r.Malformed("an entry has no rows or no columns"));
    Require(rows <= r.left() / sizeof(float) / cols, ErrorCode::kDataLoss, r.Malformed("an entry is longer than the file"));
    e.cols = static_cast<int64_t>(cols);
    e.values.resize(rows * cols);
    r.Read(e.values.data(), rows * cols * sizeof(float));
    Require(std::all_of(e.values.begin(), e.values.end(), [](float v) { return std::isfinite(v); }), ErrorCode::kDataLoss,
            r.Malformed("sample " + std::to_string(e.id) + " holds a value that is not finite"));
    take(e);
  }
  const uint64_t digest = r.digest();
  Require(r.Get<uint64_t>() == digest && r.left() == 0, ErrorCode::kDataLoss,
          r.Malformed("its checksum does not match or bytes follow it"));
}

}  // namespace

ActivationCache::ActivationCache(uint64_t memory_limit_bytes, std::string spill_dir, Env* env)
    : memory_limit_(memory_limit_bytes), spill_dir_(std::move(spill_dir)), env_(env) {
  if (!spill_dir_.empty()) env_->CreateDirs(spill_dir_);
}

ActivationCache::~ActivationCache() {
  for (const auto& [id, entry] : entries_) {
    if (entry.on_disk) env_->RemoveFile(SpillPath(id));
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

std::optional<ActivationCache::Held> ActivationCache::Describe(uint64_t id) const {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  const Entry& e = it->second;
  return Held{e.tag, static_cast<int64_t>(e.bytes / sizeof(float)) / e.cols, e.cols};
}

void ActivationCache::ReadSpilled(uint64_t id, const Entry& entry, std::vector<float>* values) const {
  const std::string path = SpillPath(id);
  values->resize(entry.bytes / sizeof(float));
  bool read = false;
  try {
    read = ReadFully(*env_->NewSequentialFile(path), values->data(), entry.bytes);
  } catch (const Error&) {  // missing: reported below with what it means
  }
  Require(read, ErrorCode::kDataLoss,
          "AQ-SGD spill file '" + path + "' is missing or short: the cache entry of sample " + std::to_string(id) +
              " is lost; restart the run's AQ-SGD warm-up");
}

std::vector<float>* ActivationCache::Find(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  Entry& entry = it->second;
  Touch(id, entry);
  if (entry.on_disk) {
    ReadSpilled(id, entry, &entry.values);
    env_->RemoveFile(SpillPath(id));
    entry.on_disk = false;
    stats_.disk_bytes -= entry.bytes;
    stats_.memory_bytes += entry.bytes;
    ++stats_.loads;
    EnforceLimit(id);
  }
  return &entry.values;
}

void ActivationCache::Insert(uint64_t id, std::vector<float> values, int64_t cols, uint64_t tag) {
  Require(cols > 0 && values.size() % static_cast<uint64_t>(cols) == 0, ErrorCode::kInvalidArgument,
          "an AQ-SGD cache entry of " + std::to_string(values.size()) + " values is not a matrix of " +
              std::to_string(cols) + " columns: give the entry's row width");
  auto it = entries_.find(id);
  if (spill_dir_.empty()) {  // a hard limit: refuse before anything changes
    const uint64_t replaced = it != entries_.end() && !it->second.on_disk ? it->second.bytes : 0;
    Require(stats_.memory_bytes - replaced + values.size() * sizeof(float) <= memory_limit_, ErrorCode::kResourceExhausted,
            "the AQ-SGD cache exceeds its memory limit of " + std::to_string(memory_limit_) +
                " bytes: raise the limit or give it a spill directory");
  }
  changed_ = true;
  if (it == entries_.end()) {
    lru_.push_front(id);
    it = entries_.emplace(id, Entry{}).first;
    it->second.lru = lru_.begin();
    ++stats_.entries;
  } else {
    Entry& old = it->second;
    if (old.on_disk) {
      env_->RemoveFile(SpillPath(id));
      stats_.disk_bytes -= old.bytes;
    } else {
      stats_.memory_bytes -= old.bytes;
    }
    Touch(id, old);
  }
  Entry& entry = it->second;
  entry.bytes = values.size() * sizeof(float);
  entry.values = std::move(values);
  entry.tag = tag;
  entry.cols = cols;
  entry.on_disk = false;
  stats_.memory_bytes += entry.bytes;
  EnforceLimit(id);
}

// Without a spill directory the memory never exceeds the limit (Insert refuses first).
void ActivationCache::EnforceLimit(uint64_t keep) {
  auto victim = lru_.end();
  while (stats_.memory_bytes > memory_limit_ && victim != lru_.begin()) {
    --victim;
    Entry& entry = entries_.at(*victim);
    if (entry.on_disk || *victim == keep) continue;
    const std::string path = SpillPath(*victim);
    try {
      const std::unique_ptr<WritableFile> out = env_->NewWritableFile(path);
      out->Append(entry.values.data(), entry.bytes);
      out->Close();
    } catch (const Error& e) {
      env_->RemoveFile(path);
      throw Error(ErrorCode::kResourceExhausted, "cannot write AQ-SGD spill file: " + std::string(e.what()) +
                                                     "; or raise the cache's memory limit");
    }
    std::vector<float>().swap(entry.values);
    entry.on_disk = true;
    stats_.memory_bytes -= entry.bytes;
    stats_.disk_bytes += entry.bytes;
    ++stats_.spills;
  }
}

void ActivationCache::Save(const std::string& path) {
  WriteFileAtomically(path, [&](const ByteSink& sink) {
    WireChecksumStream hash;
    const auto put = [&](const void* data, size_t size) {
      hash.Update(data, size);
      sink(data, size);
    };
    const uint64_t entries = entries_.size();
    put(&kFileMagic, sizeof kFileMagic);
    put(&kFileVersion, sizeof kFileVersion);
    put(&entries, sizeof entries);
    std::vector<float> spilled;
    for (const auto& [id, entry] : entries_) {
      const uint64_t cols = static_cast<uint64_t>(entry.cols), rows = entry.bytes / sizeof(float) / cols;
      put(&id, sizeof id);
      put(&entry.tag, sizeof entry.tag);
      put(&rows, sizeof rows);
      put(&cols, sizeof cols);
      if (entry.on_disk) ReadSpilled(id, entry, &spilled);
      put(entry.on_disk ? spilled.data() : entry.values.data(), entry.bytes);
    }
    const uint64_t digest = hash.Digest();
    sink(&digest, sizeof digest);
  }, env_);
  changed_ = false;
}

void ActivationCache::Load(const std::string& path) {
  Require(entries_.empty(), ErrorCode::kInternal, "ActivationCache::Load needs an empty cache");
  ReadCacheFile(*env_, path, [](FileEntry&) {});  // the whole file checked before anything is taken
  ReadCacheFile(*env_, path, [&](FileEntry& e) { Insert(e.id, std::move(e.values), e.cols, e.tag); });
  changed_ = false;
}

}  // namespace amaq::quant
