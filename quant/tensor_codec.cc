#include "quant/tensor_codec.h"

#include <string>

#include "common/base/error.h"

namespace amaq::quant {

Encoded EncodeTensor(Encoder& encoder, const torch::Tensor& x, const BitsTable& bits,
                     const EncodeOptions& options, torch::Tensor* reconstruction) {
  Require(x.dim() == 2, ErrorCode::kInvalidArgument,
          "the codec takes [tokens, channels] tensors, got " + std::to_string(x.dim()) +
              " dimensions: flatten batch and sequence first");
  const torch::Tensor cpu = x.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const int64_t rows = cpu.size(0), cols = cpu.size(1);
  float* out = nullptr;
  if (reconstruction) {
    *reconstruction = torch::empty({rows, cols}, torch::kFloat);
    out = reconstruction->data_ptr<float>();
  }
  return encoder.Encode(cpu.data_ptr<float>(), rows, cols, bits, options, out);
}

torch::Tensor DecodeTensor(Decoder& decoder, const uint8_t* data, size_t size, Decoded* info) {
  Decoded decoded;
  decoder.Decode(data, size, &decoded);
  auto* values = new std::vector<float>(std::move(decoded.values));
  torch::Tensor t = torch::from_blob(
      values->data(), {decoded.rows, decoded.cols},
      [values](void*) { delete values; }, torch::kFloat);
  if (info) *info = std::move(decoded);
  return t;
}

}  // namespace amaq::quant
