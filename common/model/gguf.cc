#include "common/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "common/base/error.h"
#include "common/base/half.h"

namespace amaq {
namespace {

constexpr int64_t kQK = 32;    // elements of a Q4_0 .. Q8_0 block
constexpr int64_t kQK_K = 256; // elements of a K-quant super-block
constexpr uint64_t kMaxDims = 4;
constexpr uint64_t kMaxArrayDepth = 4;

const GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kBF16, "BF16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", kQK, 2 + 16},
    {GgmlType::kQ4_1, "Q4_1", kQK, 2 + 2 + 16},
    {GgmlType::kQ5_0, "Q5_0", kQK, 2 + 4 + 16},
    {GgmlType::kQ5_1, "Q5_1", kQK, 2 + 2 + 4 + 16},
    {GgmlType::kQ8_0, "Q8_0", kQK, 2 + 32},
    {GgmlType::kQ4_K, "Q4_K", kQK_K, 2 + 2 + 12 + 128},
    {GgmlType::kQ5_K, "Q5_K", kQK_K, 2 + 2 + 12 + 32 + 128},
    {GgmlType::kQ6_K, "Q6_K", kQK_K, 128 + 64 + 16 + 2},
};

float Half(const uint8_t* p) { return quant::HalfToFloat(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (12 packed bytes).
void ScaleMin(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_0, Q4_1, Q5_0, Q5_1: low nibbles are elements 0..15, high nibbles 16..31; the fifth bits of
// the 5-bit types come from a 32-bit mask, bit i for element i.
void DequantizeSmallBlock(GgmlType type, const uint8_t* b, float* y) {
  const bool has_min = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
  const bool five_bit = type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
  const float d = Half(b);
  const float m = has_min ? Half(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t high = 0;
  if (five_bit) {
    std::memcpy(&high, p, 4);
    p += 4;
  }
  const int offset = has_min ? 0 : (five_bit ? 16 : 8);
  for (int j = 0; j < 16; ++j) {
    const int lo = (p[j] & 0xF) | (five_bit ? ((high >> j) & 1) << 4 : 0);
    const int hi = (p[j] >> 4) | (five_bit ? ((high >> (j + 16)) & 1) << 4 : 0);
    y[j] = static_cast<float>(lo - offset) * d + m;
    y[j + 16] = static_cast<float>(hi - offset) * d + m;
  }
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; each 32 bytes of nibbles hold two
// sub-blocks (low nibbles the first), and Q5_K's fifth bits are bit 2i / 2i+1 of qh for the pair i.
void DequantizeKBlock(bool five_bit, const uint8_t* b, float* y) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five_bit ? 48 : 16);
  for (int pair = 0; pair < 4; ++pair) {
    int s0, m0, s1, m1;
    ScaleMin(2 * pair, scales, &s0, &m0);
    ScaleMin(2 * pair + 1, scales, &s1, &m1);
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[l] & 0xF) + (five_bit && (qh[l] >> (2 * pair) & 1) ? 16 : 0);
      const int hi = (qs[l] >> 4) + (five_bit && (qh[l] >> (2 * pair + 1) & 1) ? 16 : 0);
      y[l] = d * static_cast<float>(s0) * static_cast<float>(lo) - dmin * static_cast<float>(m0);
      y[l + 32] = d * static_cast<float>(s1) * static_cast<float>(hi) - dmin * static_cast<float>(m1);
    }
    qs += 32;
    y += 64;
  }
}

// Q6_K: two halves of 128; in each, 64 bytes of low nibbles and 32 bytes of 2-bit highs make four
// runs of 32, with a signed 8-bit scale for every 16 elements and one fp16 d at the end.
void DequantizeQ6K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is] * q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
    }
    ql += 64;
    qh += 32;
    sc += 8;
    y += 128;
  }
}

// Reads the header's little-endian fields, each checked against the bytes left.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}
  uint64_t position() const { return position_; }
  uint64_t left() const { return size_ - position_; }
  const std::string& source() const { return source_; }

  void Need(uint64_t bytes, const std::string& what) const {
    if (bytes > left()) {
      throw Error(ErrorCode::kDataLoss,
                  source_ + ": " + what + " needs " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(position_) + ", but the file has " + std::to_string(left()) +
                      " left: it is truncated or not a GGUF file");
    }
  }
  template <typename T>
  T Read(const std::string& what) {
    Need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  std::string String(const std::string& what) {
    const auto length = Read<uint64_t>(what + "'s length");
    Need(length, what);
    std::string text(reinterpret_cast<const char*>(data_ + position_), length);
    position_ += length;
    return text;
  }
  // A count of items of at least `min_item_bytes` each, which must fit in what is left.
  uint64_t Count(const std::string& what, uint64_t min_item_bytes) {
    const auto count = Read<uint64_t>(what);
    if (count > left() / min_item_bytes) {
      throw Error(ErrorCode::kDataLoss, source_ + ": " + what + " is " + std::to_string(count) +
                                            ", more than the " + std::to_string(left()) +
                                            " bytes left can hold: the file is damaged");
    }
    return count;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t position_ = 0;
  const std::string& source_;
};

// The fewest bytes a value of `type` takes in the file (arrays: type and count).
uint64_t MinValueBytes(GgufValue::Type type) {
  switch (type) {
    case GgufValue::Type::kUint8: case GgufValue::Type::kInt8: case GgufValue::Type::kBool: return 1;
    case GgufValue::Type::kUint16: case GgufValue::Type::kInt16: return 2;
    case GgufValue::Type::kUint32: case GgufValue::Type::kInt32: case GgufValue::Type::kFloat32: return 4;
    case GgufValue::Type::kString: case GgufValue::Type::kUint64: case GgufValue::Type::kInt64:
    case GgufValue::Type::kFloat64: return 8;
    case GgufValue::Type::kArray: return 12;
  }
  return 0;
}

GgufValue ReadValue(Reader& in, uint32_t raw_type, const std::string& key, uint64_t depth) {
  if (raw_type > static_cast<uint32_t>(GgufValue::Type::kFloat64)) {
    throw Error(ErrorCode::kDataLoss, in.source() + ": metadata '" + Excerpt(key) + "' has value type " +
                                          std::to_string(raw_type) +
                                          ", which GGUF does not define (0..12): the file is damaged");
  }
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(raw_type);
  const std::string what = "metadata '" + Excerpt(key) + "'";  // Reader's errors name the file
  const std::string where = in.source() + ": " + what;
  switch (v.type) {
    case GgufValue::Type::kUint8: v.integer = in.Read<uint8_t>(what); break;
    case GgufValue::Type::kInt8: v.integer = in.Read<int8_t>(what); break;
    case GgufValue::Type::kUint16: v.integer = in.Read<uint16_t>(what); break;
    case GgufValue::Type::kInt16: v.integer = in.Read<int16_t>(what); break;
    case GgufValue::Type::kUint32: v.integer = in.Read<uint32_t>(what); break;
    case GgufValue::Type::kInt32: v.integer = in.Read<int32_t>(what); break;
    case GgufValue::Type::kInt64: v.integer = in.Read<int64_t>(what); break;
    case GgufValue::Type::kUint64: {
      const auto u = in.Read<uint64_t>(what);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Error(ErrorCode::kDataLoss, where + " is " + std::to_string(u) +
                                              ", beyond what amaq reads (2^63 - 1): the file is damaged");
      }
      v.integer = static_cast<int64_t>(u);
      break;
    }
    case GgufValue::Type::kFloat32: v.real = in.Read<float>(what); break;
    case GgufValue::Type::kFloat64: v.real = in.Read<double>(what); break;
    case GgufValue::Type::kBool: {
      const auto b = in.Read<uint8_t>(what);
      if (b > 1) throw Error(ErrorCode::kDataLoss, where + " is a bool of value " + std::to_string(b) + ", not 0 or 1: the file is damaged");
      v.boolean = b == 1;
      break;
    }
    case GgufValue::Type::kString: v.text = in.String(what); break;
    case GgufValue::Type::kArray: {
      if (depth >= kMaxArrayDepth) {
        throw Error(ErrorCode::kDataLoss, where + " nests arrays deeper than " + std::to_string(kMaxArrayDepth) + ": the file is damaged");
      }
      const auto element_type = in.Read<uint32_t>(what + "'s element type");
      if (element_type > static_cast<uint32_t>(GgufValue::Type::kFloat64)) {
        throw Error(ErrorCode::kDataLoss, where + " is an array of type " + std::to_string(element_type) +
                                              ", which GGUF does not define (0..12): the file is damaged");
      }
      v.element_type = static_cast<GgufValue::Type>(element_type);
      const uint64_t count = in.Count(what + "'s element count", MinValueBytes(v.element_type));
      v.elements.reserve(count);
      for (uint64_t i = 0; i < count; ++i) v.elements.push_back(ReadValue(in, element_type, key, depth + 1));
      break;
    }
  }
  return v;
}

bool IsInteger(GgufValue::Type t) {
  return t != GgufValue::Type::kFloat32 && t != GgufValue::Type::kFloat64 && t != GgufValue::Type::kBool &&
         t != GgufValue::Type::kString && t != GgufValue::Type::kArray;
}

}  // namespace

std::optional<GgmlTypeInfo> GgmlTypeFor(uint32_t id) {
  for (const auto& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == id) return info;
  }
  return std::nullopt;
}

void DequantizeBlocks(GgmlType type, const uint8_t* blocks, int64_t elements, float* out) {
  const auto info = GgmlTypeFor(static_cast<uint32_t>(type));
  Require(info.has_value() && elements % info->block_elements == 0, ErrorCode::kInternal,
          "DequantizeBlocks: a count that is not a whole number of blocks of a known type");
  for (int64_t i = 0; i < elements / info->block_elements; ++i) {
    const uint8_t* b = blocks + i * info->block_bytes;
    float* y = out + i * info->block_elements;
    switch (type) {
      case GgmlType::kF32: std::memcpy(y, b, 4); break;
      case GgmlType::kF16: *y = Half(b); break;
      case GgmlType::kBF16: *y = quant::BFloat16ToFloat(static_cast<uint16_t>(b[0] | b[1] << 8)); break;
      case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1:
        DequantizeSmallBlock(type, b, y);
        break;
      case GgmlType::kQ8_0: {
        const float d = Half(b);
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
        break;
      }
      case GgmlType::kQ4_K: DequantizeKBlock(false, b, y); break;
      case GgmlType::kQ5_K: DequantizeKBlock(true, b, y); break;
      case GgmlType::kQ6_K: DequantizeQ6K(b, y); break;
    }
  }
}

struct GgufFile::Mapping {
  void* address = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (address != MAP_FAILED) munmap(address, size);
  }
};

GgufFile GgufFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  Require(fd >= 0, ErrorCode::kNotFound,
          path + ": cannot open GGUF file (" + std::strerror(errno) + "): check the path");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    throw Error(ErrorCode::kNotFound, path + ": cannot read the GGUF file's size (" + std::strerror(error) + "): check the path");
  }
  auto mapping = std::make_shared<Mapping>();
  if (st.st_size > 0) {
    mapping->address = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    mapping->size = static_cast<size_t>(st.st_size);
  }
  close(fd);
  Require(st.st_size > 0, ErrorCode::kDataLoss, path + ": the file is empty: fetch it again");
  Require(mapping->address != MAP_FAILED, ErrorCode::kInternal, path + ": mmap failed");
  GgufFile file = Parse(static_cast<const uint8_t*>(mapping->address), mapping->size, path);
  file.mapping_ = std::move(mapping);
  return file;
}

GgufFile GgufFile::Parse(const uint8_t* data, uint64_t size, const std::string& source) {
  GgufFile file;
  file.source_ = source;
  Reader in(data, size, source);
  Require(size >= 4 && std::memcmp(data, "GGUF", 4) == 0, ErrorCode::kDataLoss,
          source + ": does not start with \"GGUF\": it is not a GGUF file");
  in.Read<uint32_t>("magic");
  file.version_ = in.Read<uint32_t>("version");
  Require(file.version_ == 2 || file.version_ == 3, ErrorCode::kDataLoss,
          source + ": GGUF version " + std::to_string(file.version_) +
              ": amaq reads versions 2 and 3 (little-endian); convert the file with a current llama.cpp");
  const uint64_t tensor_count = in.Count("the tensor count", 8 + 4 + 4 + 8);
  const uint64_t kv_count = in.Count("the metadata count", 8 + 4 + 1);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = in.String("metadata key " + std::to_string(i));
    const auto type = in.Read<uint32_t>("metadata '" + Excerpt(key) + "''s type");
    GgufValue value = ReadValue(in, type, key, 0);
    Require(file.metadata_.emplace(key, std::move(value)).second, ErrorCode::kDataLoss,
            source + ": metadata key '" + Excerpt(key) + "' appears twice: the file is damaged");
  }
  uint64_t alignment = 32;
  if (file.Has("general.alignment")) {
    const int64_t a = file.Integer("general.alignment");
    Require(a > 0 && a <= 65536 && (a & (a - 1)) == 0, ErrorCode::kDataLoss,
            source + ": general.alignment is " + std::to_string(a) + ", not a power of two up to 65536: the file is damaged");
    alignment = static_cast<uint64_t>(a);
  }
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = in.String("tensor name " + std::to_string(i));
    const std::string what = "tensor '" + Excerpt(t.name) + "'";  // Reader's errors name the file
    const std::string where = source + ": " + what;
    const auto n_dims = in.Read<uint32_t>(what + "'s dimension count");
    Require(n_dims >= 1 && n_dims <= kMaxDims, ErrorCode::kDataLoss,
            where + " has " + std::to_string(n_dims) + " dimensions, not 1..4: the file is damaged");
    t.elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = in.Read<uint64_t>(what + "'s dimensions");
      Require(dim >= 1 && dim <= (uint64_t{1} << 40) && static_cast<uint64_t>(t.elements) <= (uint64_t{1} << 40) / dim,
              ErrorCode::kDataLoss, where + " has a dimension of " + std::to_string(dim) +
                                        " or more than 2^40 elements: the file is damaged");
      t.dims.push_back(static_cast<int64_t>(dim));
      t.elements *= static_cast<int64_t>(dim);
    }
    const auto type_id = in.Read<uint32_t>(what + "'s type");
    const auto type = GgmlTypeFor(type_id);
    Require(type.has_value(), ErrorCode::kDataLoss,
            where + " has ggml type " + std::to_string(type_id) +
                ", which amaq does not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): "
                "requantize the file to one of them");
    t.type = *type;
    Require(t.dims[0] % t.type.block_elements == 0, ErrorCode::kDataLoss,
            where + "'s rows of " + std::to_string(t.dims[0]) + " are not whole " + t.type.name +
                " blocks of " + std::to_string(t.type.block_elements) + ": the file is damaged");
    t.bytes = static_cast<uint64_t>(t.elements / t.type.block_elements) * static_cast<uint64_t>(t.type.block_bytes);
    t.offset = in.Read<uint64_t>(what + "'s offset");
    Require(t.offset % alignment == 0, ErrorCode::kDataLoss,
            where + "'s offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                std::to_string(alignment) + ": the file is damaged");
    file.tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (in.position() + alignment - 1) / alignment * alignment;
  Require(data_start <= size, ErrorCode::kDataLoss,
          source + ": the data section would start at " + std::to_string(data_start) + ", past the end (" +
              std::to_string(size) + " bytes): the file is truncated");
  const uint64_t data_size = size - data_start;
  std::map<std::string, int> seen;
  for (const auto& t : file.tensors_) {
    Require(seen.emplace(t.name, 0).second, ErrorCode::kDataLoss,
            source + ": tensor '" + Excerpt(t.name) + "' appears twice: the file is damaged");
    Require(t.offset <= data_size && t.bytes <= data_size - t.offset, ErrorCode::kDataLoss,
            source + ": tensor '" + Excerpt(t.name) + "' (" + std::to_string(t.bytes) + " bytes at " +
                std::to_string(t.offset) + ") ends past the data section's " + std::to_string(data_size) +
                " bytes: the file is truncated");
  }
  file.data_section_ = data + data_start;
  return file;
}

int64_t GgufFile::Integer(const std::string& key) const {
  const auto it = metadata_.find(key);
  Require(it != metadata_.end() && IsInteger(it->second.type), ErrorCode::kDataLoss,
          source_ + ": metadata '" + key + "' is missing or not an integer: the file is not a model amaq reads");
  return it->second.integer;
}

double GgufFile::Real(const std::string& key) const {
  const auto it = metadata_.find(key);
  Require(it != metadata_.end() && it->second.type != GgufValue::Type::kString &&
              it->second.type != GgufValue::Type::kArray && it->second.type != GgufValue::Type::kBool,
          ErrorCode::kDataLoss, source_ + ": metadata '" + key + "' is missing or not a number: the file is not a model amaq reads");
  return IsInteger(it->second.type) ? static_cast<double>(it->second.integer) : it->second.real;
}

const std::string& GgufFile::Text(const std::string& key) const {
  const auto it = metadata_.find(key);
  Require(it != metadata_.end() && it->second.type == GgufValue::Type::kString, ErrorCode::kDataLoss,
          source_ + ": metadata '" + key + "' is missing or not a string: the file is not a model amaq reads");
  return it->second.text;
}

std::vector<std::string> GgufFile::Texts(const std::string& key) const {
  const auto it = metadata_.find(key);
  Require(it != metadata_.end() && it->second.type == GgufValue::Type::kArray &&
              it->second.element_type == GgufValue::Type::kString,
          ErrorCode::kDataLoss, source_ + ": metadata '" + key + "' is missing or not an array of strings");
  std::vector<std::string> texts;
  texts.reserve(it->second.elements.size());
  for (const auto& e : it->second.elements) texts.push_back(e.text);
  return texts;
}

std::vector<int64_t> GgufFile::Integers(const std::string& key) const {
  const auto it = metadata_.find(key);
  Require(it != metadata_.end() && it->second.type == GgufValue::Type::kArray && IsInteger(it->second.element_type),
          ErrorCode::kDataLoss, source_ + ": metadata '" + key + "' is missing or not an array of integers");
  std::vector<int64_t> values;
  values.reserve(it->second.elements.size());
  for (const auto& e : it->second.elements) values.push_back(e.integer);
  return values;
}

const GgufTensorInfo& GgufFile::Tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw Error(ErrorCode::kNotFound, source_ + ": has no tensor '" + name + "': is it a model of the expected architecture?");
}

std::vector<float> GgufFile::Dequantize(const GgufTensorInfo& tensor) const {
  std::vector<float> values(static_cast<size_t>(tensor.elements));
  DequantizeInto(tensor, values.data());
  return values;
}

void GgufFile::DequantizeInto(const GgufTensorInfo& tensor, float* out) const {
  DequantizeBlocks(tensor.type.type, data_section_ + tensor.offset, tensor.elements, out);
}

}  // namespace amaq
