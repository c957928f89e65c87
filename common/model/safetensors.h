// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw tensor bytes. SafetensorsFile memory-maps a file, validates its whole header up front, and
// copies out only the tensors asked for. Supported dtypes: F32, F16, BF16. Every problem (short
// file, header lying about offsets, unknown dtype, missing tensor, wrong shape) throws amaq::Error
// naming the file and the tensor.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace amaq {

struct TensorEntry {
  std::string dtype;  // "F32", "F16" or "BF16"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  static SafetensorsFile Open(const std::string& path);

  bool Has(const std::string& name) const { return entries_.count(name) != 0; }
  std::vector<std::string> Names() const;
  const TensorEntry& Entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Copies tensor `name` out of the file as `dtype` (on the CPU). When `expected_shape` is given,
  // a different stored shape is an error; a NaN or an infinity (stored, or made by the conversion
  // to `dtype`) is kDataLoss naming the tensor.
  torch::Tensor Load(const std::string& name, torch::Dtype dtype = torch::kFloat,
                     const std::vector<int64_t>* expected_shape = nullptr) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes named tensors (each converted to `dtype`: kFloat, kHalf or kBFloat16) atomically.
void WriteSafetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      torch::Dtype dtype = torch::kFloat,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace amaq
