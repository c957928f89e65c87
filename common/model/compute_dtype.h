// The dtype a part computes its activations in (ModelPart::set_compute_dtype), as the programs
// name it: "fp32" (the default; exact against the reference) or "bf16" (half the activation
// memory; with nf4 base weights QLoRA's recipe). Parameters keep their own dtype either way.
#pragma once

#include <torch/torch.h>

#include <string>

namespace amaq {

// "fp32" | "bf16"; amaq::Error kInvalidArgument naming the accepted values otherwise.
torch::Dtype ParseComputeDtype(const std::string& text);

}  // namespace amaq
