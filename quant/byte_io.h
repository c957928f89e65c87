// Little-endian reading and writing of the fixed-width fields of amaq's binary formats.
// ByteReader checks every read against the end of its buffer and throws amaq::Error (kDataLoss)
// naming the field, so parsers built on it never read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/base/error.h"

namespace amaq::quant {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}

  template <typename T>
  void Put(T value) {
    static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>);
    const size_t at = out_->size();
    out_->resize(at + sizeof(T));
    std::memcpy(out_->data() + at, &value, sizeof(T));  // host order is little-endian (bitpack.h)
  }
  void PutBytes(const uint8_t* data, size_t size) { out_->insert(out_->end(), data, data + size); }

 private:
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T Get(const char* field) {
    T value;
    std::memcpy(&value, Take(sizeof(T), field), sizeof(T));
    return value;
  }
  // Returns a pointer to the next `size` bytes and advances past them.
  const uint8_t* Take(uint64_t size, const char* field) {
    Require(size <= size_ - pos_, ErrorCode::kDataLoss,
            std::string("message ends inside field '") + field + "' (needs " +
                std::to_string(size) + " bytes, " + std::to_string(size_ - pos_) +
                " left): it was truncated; resend it");
    const uint8_t* at = data_ + pos_;
    pos_ += static_cast<size_t>(size);
    return at;
  }
  size_t position() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  // Reads a format's magic and version: kDataLoss naming `format` ("AQ-SGD frame") when the magic
  // is not `magic` (`letters`, as the bytes read) or the version is not `version`.
  void ExpectFormat(uint32_t magic, uint8_t version, const std::string& format, const char* letters) {
    Require(Get<uint32_t>("magic") == magic, ErrorCode::kDataLoss,
            format + " does not start with '" + letters + "': it is not one, or it is corrupted");
    const auto found = Get<uint8_t>("version");
    Require(found == version, ErrorCode::kDataLoss,
            format + " has format version " + std::to_string(found) + ", this build reads " + std::to_string(version) +
                ": run the same amaq version on both sides");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace amaq::quant
