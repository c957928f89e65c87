#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/atomic_file.h"
#include "common/base/error.h"

namespace amaq {
namespace {

constexpr uint64_t kLoadSliceBytes = 16 << 20;  // file bytes copied between page releases
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

size_t DtypeBytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

torch::Dtype TorchDtype(const std::string& dtype) {
  if (dtype == "F32") return torch::kFloat;
  if (dtype == "F16") return torch::kHalf;
  return torch::kBFloat16;
}

std::string SafetensorsDtype(torch::Dtype dtype) {
  if (dtype == torch::kFloat) return "F32";
  if (dtype == torch::kHalf) return "F16";
  Require(dtype == torch::kBFloat16, ErrorCode::kInvalidArgument,
          "safetensors files are written as F32, F16 or BF16 only");
  return "BF16";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

struct SafetensorsFile::Mapping {
  void* address = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (address != MAP_FAILED) munmap(address, size);
  }
};

SafetensorsFile SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  const int fd = open(path.c_str(), O_RDONLY);
  Require(fd >= 0, ErrorCode::kNotFound,
          path + ": cannot open safetensors file (" + std::strerror(errno) + "): check the path");
  struct stat st {};
  fstat(fd, &st);
  const auto size = static_cast<uint64_t>(st.st_size);
  auto mapping = std::make_shared<Mapping>();
  if (size > 0) {
    mapping->address = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    mapping->size = size;
  }
  close(fd);
  Require(size >= 8, ErrorCode::kDataLoss,
          path + ": file is " + std::to_string(size) + " bytes, too short for a safetensors header: it is truncated");
  Require(mapping->address != MAP_FAILED, ErrorCode::kInternal, path + ": mmap failed");
  const auto* bytes = static_cast<const uint8_t*>(mapping->address);
  uint64_t header_size;
  std::memcpy(&header_size, bytes, 8);
  Require(header_size <= kMaxHeaderBytes && header_size <= size - 8, ErrorCode::kDataLoss,
          path + ": header length " + std::to_string(header_size) + " does not fit the file (" +
              std::to_string(size) + " bytes): the file is truncated or not safetensors");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_size);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kDataLoss, path + ": header is not valid JSON (" + e.what() + ")");
  }
  Require(header.is_object(), ErrorCode::kDataLoss, path + ": header is not a JSON object");
  const uint64_t data_size = size - 8 - header_size;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (value.is_object()) {
        for (const auto& [k, v] : value.items()) {
          if (v.is_string()) file.metadata_[k] = v.get<std::string>();
        }
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    TensorEntry e;
    try {
      e.dtype = value.at("dtype").get<std::string>();
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      const auto offsets = value.at("data_offsets").get<std::vector<uint64_t>>();
      Require(offsets.size() == 2, ErrorCode::kDataLoss, where + ": data_offsets must have 2 entries");
      e.begin = offsets[0];
      e.end = offsets[1];
    } catch (const nlohmann::json::exception& ex) {
      throw Error(ErrorCode::kDataLoss, where + ": malformed header entry (" + ex.what() + ")");
    }
    Require(e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16", ErrorCode::kDataLoss,
            where + " has dtype " + e.dtype + ": amaq reads F32, F16 and BF16; convert the checkpoint");
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      Require(d >= 0 && (d == 0 || numel <= std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d)),
              ErrorCode::kDataLoss, where + " has an invalid shape " + ShapeText(e.shape));
      numel *= static_cast<uint64_t>(d);
    }
    Require(e.begin <= e.end && e.end <= data_size, ErrorCode::kDataLoss,
            where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                ") lie outside the " + std::to_string(data_size) + "-byte data section: the file is truncated or corrupted");
    Require(e.end - e.begin == numel * DtypeBytes(e.dtype), ErrorCode::kDataLoss,
            where + ": " + std::to_string(e.end - e.begin) + " bytes stored for shape " +
                ShapeText(e.shape) + " of " + e.dtype + ": the header is inconsistent");
    file.entries_.emplace(name, std::move(e));
  }
  file.mapping_ = std::move(mapping);
  file.data_ = bytes + 8 + header_size;
  return file;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

const TensorEntry& SafetensorsFile::Entry(const std::string& name) const {
  const auto it = entries_.find(name);
  Require(it != entries_.end(), ErrorCode::kNotFound,
          path_ + ": has no tensor '" + name + "': the checkpoint does not match the model config");
  return it->second;
}

namespace {
// Whether every value of `t` is finite: fp32 by its exponent bits (all ones: NaN or infinity) in
// one vectorizable pass (half torch::isfinite's cost on SmolLM2's load); other dtypes through LibTorch.
bool AllFinite(const torch::Tensor& t) {
  if (t.scalar_type() != torch::kFloat || !t.is_contiguous()) return torch::isfinite(t).all().item<bool>();
  const auto* bits = static_cast<const uint32_t*>(t.data_ptr());
  uint32_t exponent_all_ones = 0;
  for (int64_t i = 0; i < t.numel(); ++i) exponent_all_ones |= static_cast<uint32_t>((bits[i] & 0x7F800000u) == 0x7F800000u);
  return exponent_all_ones == 0;
}
}  // namespace

torch::Tensor SafetensorsFile::Load(const std::string& name, torch::Dtype dtype,
                                    const std::vector<int64_t>* expected_shape) const {
  const TensorEntry& e = Entry(name);
  if (expected_shape) {
    Require(e.shape == *expected_shape, ErrorCode::kInvalidArgument,
            path_ + ": tensor '" + name + "' has shape " + ShapeText(e.shape) + " but the model config needs " +
                ShapeText(*expected_shape) + ": the checkpoint and config.json disagree");
  }
  const auto source = torch::TensorOptions().dtype(TorchDtype(e.dtype));
  torch::Tensor out = torch::empty(e.shape, dtype);
  if (out.numel() == 0) return out;
  // Copied in slices of rows, each slice's file pages given back once copied: loading never holds
  // more than a slice of the file's pages besides the result (the pages are re-read from the
  // file, or the page cache, if the tensor is loaded again).
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  const uint64_t row_bytes = (e.end - e.begin) / static_cast<uint64_t>(rows);
  const int64_t slice_rows = std::max<int64_t>(1, static_cast<int64_t>(kLoadSliceBytes / std::max<uint64_t>(row_bytes, 1)));
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (int64_t r = 0; r < rows; r += slice_rows) {
    const int64_t n = std::min(slice_rows, rows - r);
    const uint8_t* begin = data_ + e.begin + static_cast<uint64_t>(r) * row_bytes;
    std::vector<int64_t> shape = e.shape.empty() ? std::vector<int64_t>{} : e.shape;
    if (!shape.empty()) shape[0] = n;
    const torch::Tensor slice = torch::from_blob(const_cast<uint8_t*>(begin), shape, source);
    torch::Tensor copied = e.shape.empty() ? out : out.narrow(0, r, n);
    copied.copy_(slice);
    // A NaN or an infinity in a weight makes every output garbage: refuse it here, by name, rather
    // than print nonsense later (also one that the conversion to `dtype` made, e.g. fp32 above
    // fp16). Checked slice by slice, while the slice is in the cache.
    Require(AllFinite(copied), ErrorCode::kDataLoss,
            path_ + ": tensor '" + name + "' holds values that are not finite (NaN or infinity)" +
                (TorchDtype(e.dtype) == dtype ? "" : " once converted from " + e.dtype) +
                ": the file is damaged; fetch, convert or export it again");
    const auto first = reinterpret_cast<uintptr_t>(begin) / page * page;
    const auto last = reinterpret_cast<uintptr_t>(begin + static_cast<uint64_t>(n) * row_bytes);
    madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
  return out;
}

void WriteSafetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      torch::Dtype dtype, const std::map<std::string, std::string>& metadata) {
  const std::string dtype_name = SafetensorsDtype(dtype);
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    torch::Tensor t = tensor.detach().to(torch::kCPU, dtype).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data section
  const uint64_t header_size = header_text.size();
  std::vector<std::pair<const void*, size_t>> parts = {{&header_size, 8},
                                                        {header_text.data(), header_text.size()}};
  for (const torch::Tensor& t : data) {
    parts.emplace_back(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  WriteFileAtomically(path, parts);
}

}  // namespace amaq
