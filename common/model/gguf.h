// GGUF files (llama.cpp's model format, versions 2 and 3, little-endian): a header (magic "GGUF",
// version, tensor count, metadata count), typed key/value metadata (integers, floats, bools,
// strings and arrays of them), tensor infos (name, dims with the fastest-varying first, ggml type,
// offset), then the tensor data, each tensor at a multiple of `general.alignment` (default 32)
// from the aligned end of the infos.
//
// GgufFile validates the whole header when it is opened: every count, length and offset is checked
// against the bytes that remain before anything is allocated for it, and every tensor must lie
// inside the file; each problem throws amaq::Error (kDataLoss) naming the file and what is wrong.
// Dequantize() turns a tensor of any type in GgmlTypeFor() into fp32 values, in the file's element
// order (dims[0] fastest). No torch here: the reader builds and fuzzes on its own.
//
// Lifetime: a GgufFile owns its mapping (Open) or borrows the caller's bytes (Parse), which must
// outlive it; metadata and infos are copied out at open.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace amaq {

// The ggml tensor types (ggml.h's enum ggml_type) this reader dequantizes.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;       // "Q4_1"
  int64_t block_elements; // values a block holds (1 for the float types)
  int64_t block_bytes;    // bytes a block takes
};

// The type with ggml id `id`, or nullopt for one this reader does not know.
std::optional<GgmlTypeInfo> GgmlTypeFor(uint32_t id);

// Dequantizes `elements` values of `type` (a multiple of its block) from `blocks` into `out`.
void DequantizeBlocks(GgmlType type, const uint8_t* blocks, int64_t elements, float* out);

// One metadata value. Integers of every width are held in `integer` (uint64 above INT64_MAX is an
// error at open), floats in `real`; arrays hold their elements (all of `element_type`).
struct GgufValue {
  enum class Type : uint32_t {
    kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
    kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
  };
  Type type = Type::kUint8;
  int64_t integer = 0;
  double real = 0;
  bool boolean = false;
  std::string text;
  Type element_type = Type::kUint8;  // kArray only
  std::vector<GgufValue> elements;   // kArray only
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // as stored: dims[0] varies fastest (a PyTorch shape reversed)
  GgmlTypeInfo type;
  uint64_t offset = 0;        // from the start of the data section
  int64_t elements = 0;
  uint64_t bytes = 0;
};

class GgufFile {
 public:
  // Maps `path` and validates it. Throws amaq::Error: kNotFound when it cannot be opened,
  // kDataLoss for anything malformed.
  static GgufFile Open(const std::string& path);
  // Validates `size` bytes at `data` (borrowed), naming them `source` in errors.
  static GgufFile Parse(const uint8_t* data, uint64_t size, const std::string& source);

  uint32_t version() const { return version_; }
  const std::string& source() const { return source_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // Typed metadata reads; a missing key or another type throws kDataLoss naming the key.
  bool Has(const std::string& key) const { return metadata_.count(key) != 0; }
  int64_t Integer(const std::string& key) const;
  double Real(const std::string& key) const;  // a float, or an integer
  const std::string& Text(const std::string& key) const;
  std::vector<std::string> Texts(const std::string& key) const;
  std::vector<int64_t> Integers(const std::string& key) const;

  const GgufTensorInfo& Tensor(const std::string& name) const;  // kNotFound if absent
  // The tensor's values as fp32, dims[0] fastest; DequantizeInto writes them to `out`, which
  // holds tensor.elements floats.
  std::vector<float> Dequantize(const GgufTensorInfo& tensor) const;
  void DequantizeInto(const GgufTensorInfo& tensor, float* out) const;

 private:
  struct Mapping;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_section_ = nullptr;
  std::string source_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace amaq
