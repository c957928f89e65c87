// The dtype a part computes its activations in (ModelPart::set_compute_dtype), as the programs
// name it: "fp32" (exact against the reference), "bf16" (half the activation memory, 1.5x faster
// where the device has bf16 arithmetic; with nf4 base weights QLoRA's recipe) or "auto" (the
// default: bf16 where `device` computes it natively, fp32 elsewhere). Parameters keep their own
// dtype either way; docs/model.md has the measured speed and accuracy of both.
#pragma once

#include <torch/torch.h>

#include <string>

namespace amaq {

// True on a CUDA device (a pre-Ampere GPU emulates bf16: name fp32 there) and on an x86 CPU with
// AVX512_BF16 or AMX-BF16; false elsewhere (a CPU without them converts at every product).
bool ComputesBf16Natively(const torch::Device& device);

// "fp32" | "bf16" | "auto" resolved for `device`; amaq::Error kInvalidArgument naming the accepted
// values otherwise.
torch::Dtype ParseComputeDtype(const std::string& text, const torch::Device& device);

// "fp32" or "bf16": the name of a dtype ParseComputeDtype returns (for logs, results, identities).
std::string ComputeDtypeName(torch::Dtype dtype);

}  // namespace amaq
