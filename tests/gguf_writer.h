// GGUF files for tests, written as gguf.md lays them out: GgufWriter writes the fields one by one
// (for files that are wrong on purpose); GgufBuilder collects metadata and F32 tensors and writes a
// valid version-3 file with 32-byte alignment; SampleFile is a file with every metadata value type
// (the reader's tests and the fuzzer's seeds).
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

// A version-3 file with one key of every value type, an array of strings, an array of arrays, a
// 64-byte alignment, an F32 tensor and a Q8_0 tensor.
inline std::vector<uint8_t> SampleFile(uint32_t version = 3) {
  GgufWriter w;
  w.Header(version);
  w.U64(2);   // tensors
  w.U64(15);  // metadata
  const auto key = [&](const std::string& k, uint32_t type) { w.Str(k); w.U32(type); };
  key("u8", 0); w.U8(200);
  key("i8", 1); w.U8(0xFE);  // -2
  key("u16", 2); w.Raw("\x34\x12", 2);
  key("i16", 3); w.Raw("\xFF\xFF", 2);  // -1
  key("u32", 4); w.U32(4000000000u);
  key("i32", 5); w.U32(static_cast<uint32_t>(-7));
  key("f32", 6); w.F32(1e-5f);
  key("bool", 7); w.U8(1);
  key("general.architecture", 8); w.Str("llama");
  key("u64", 10); w.U64(uint64_t{1} << 40);
  key("i64", 11); w.U64(static_cast<uint64_t>(int64_t{-3}));
  key("f64", 12); { const double v = 10000.5; w.Raw(&v, 8); }
  key("tokens", 9); w.U32(8); w.U64(3); w.Str("a"); w.Str("b c"); w.Str("");
  key("nested", 9); w.U32(9); w.U64(2);
  w.U32(4); w.U64(2); w.U32(1); w.U32(2);  // [1, 2]
  w.U32(4); w.U64(0);                      // []
  key("general.alignment", 4); w.U32(64);
  // tensor infos: "w" F32 [4, 2] at 0; "q" Q8_0 [32] at 64
  w.Str("w"); w.U32(2); w.U64(4); w.U64(2); w.U32(0); w.U64(0);
  w.Str("q"); w.U32(1); w.U64(32); w.U32(8); w.U64(64);
  w.PadTo(64);
  for (int i = 0; i < 8; ++i) w.F32(static_cast<float>(i) - 3.5f);
  w.PadTo(64);
  w.Raw("\x00\x3c", 2);  // d = 1.0
  for (int i = 0; i < 32; ++i) w.U8(static_cast<uint8_t>(i - 16));
  return w.bytes;
}

}  // namespace amaq::testing_gguf
