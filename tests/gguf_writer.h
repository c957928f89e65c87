// GGUF files for tests, written as gguf.md lays them out: GgufWriter writes the fields one by one
// (for files that are wrong on purpose); GgufBuilder collects metadata and F32 tensors and writes a
// valid version-3 file with 32-byte alignment.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace amaq::testing_gguf {

class GgufWriter {
 public:
  void Header(uint32_t version = 3) {
    Raw("GGUF", 4);
    U32(version);
  }
  void U8(uint8_t v) { Raw(&v, 1); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Str(const std::string& s) {
    U64(s.size());
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), c, c + n);
  }
  void PadTo(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }
  std::vector<uint8_t> bytes;
};

class GgufBuilder {
 public:
  void U32(const std::string& key, uint32_t v) { Key(key, 4).U32(v); }
  void F32(const std::string& key, float v) { Key(key, 6).F32(v); }
  void Bool(const std::string& key, bool v) { Key(key, 7).U8(v ? 1 : 0); }
  void Str(const std::string& key, const std::string& v) { Key(key, 8).Str(v); }
  void Strs(const std::string& key, const std::vector<std::string>& v) {
    Key(key, 9).U32(8);
    kv_.U64(v.size());
    for (const auto& s : v) kv_.Str(s);
  }
  void I32s(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, 9).U32(5);
    kv_.U64(v.size());
    for (int32_t i : v) kv_.U32(static_cast<uint32_t>(i));
  }
  // An F32 tensor; dims as GGUF lists them (the fastest first: a PyTorch shape reversed).
  void Tensor(const std::string& name, const std::vector<uint64_t>& dims, const std::vector<float>& values) {
    tensors_.push_back({name, dims, values});
  }
  std::vector<uint8_t> Bytes() const {
    GgufWriter w;
    w.Header();
    w.U64(tensors_.size());
    w.U64(keys_);
    w.Raw(kv_.bytes.data(), kv_.bytes.size());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      w.Str(t.name);
      w.U32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) w.U64(d);
      w.U32(0);  // F32
      w.U64(offset);
      offset += (t.values.size() * 4 + 31) / 32 * 32;
    }
    w.PadTo(32);
    for (const auto& t : tensors_) {
      w.Raw(t.values.data(), t.values.size() * 4);
      w.PadTo(32);
    }
    return w.bytes;
  }

 private:
  struct TensorData {
    std::string name;
    std::vector<uint64_t> dims;
    std::vector<float> values;
  };
  GgufWriter& Key(const std::string& key, uint32_t type) {
    ++keys_;
    kv_.Str(key);
    kv_.U32(type);
    return kv_;
  }
  GgufWriter kv_;  // the metadata's bytes
  uint64_t keys_ = 0;
  std::vector<TensorData> tensors_;
};

}  // namespace amaq::testing_gguf
