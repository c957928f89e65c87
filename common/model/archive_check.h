// RequireFiniteArchive: a training checkpoint (a LibTorch archive: the server's sessions, a client's
// LoRA, optimizer and codec state) is checked before anything is taken from it: every floating-point
// tensor in it, nested archives included, must be finite. A NaN or an infinity there would train on
// silently (or print garbage with exit code 0), so it is refused with the file and the tensor's key.
#pragma once

#include <torch/serialize/input-archive.h>

#include <string>

namespace amaq {

// Throws amaq::Error (kDataLoss) naming `path` and the first non-finite tensor's key
// ("optimizer/0/exp_avg" for nested archives). Reads the archive; changes nothing.
void RequireFiniteArchive(torch::serialize::InputArchive& archive, const std::string& path);

}  // namespace amaq
