// The codec applied to LibTorch tensors: a 2-D tensor on any device and of any floating dtype is
// encoded from (and decoded to) fp32 on the CPU, where the wire bytes are made. This is the one
// place where quant/ meets torch tensors; the codec itself stays torch-free.
#pragma once

#include <torch/types.h>

#include "quant/codec.h"

namespace amaq::quant {

// Encodes x [rows, cols]. When `reconstruction` is not null it is set to the decoded values
// (fp32, on the CPU): bit for bit what the receiver will see.
Encoded EncodeTensor(Encoder& encoder, const torch::Tensor& x, const BitsTable& bits,
                     const EncodeOptions& options, torch::Tensor* reconstruction = nullptr);

// Decodes one message into an fp32 CPU tensor [rows, cols]; `info`, when not null, receives the
// header fields and byte counts (its values vector is left empty).
torch::Tensor DecodeTensor(Decoder& decoder, const uint8_t* data, size_t size,
                           Decoded* info = nullptr);

}  // namespace amaq::quant
