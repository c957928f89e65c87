// Training checkpoints (LibTorch archives: the server's sessions, a client's LoRA, optimizer and
// codec state), read through an Env (common/base/env.h), and checked before anything is taken from
// them: every floating-point tensor in one, nested archives included, must be finite. A NaN or an
// infinity there would train on silently (or print garbage with exit code 0), so it is refused with
// the file and the tensor's key.
#pragma once

#include <torch/serialize/input-archive.h>

#include <string>

#include "common/base/env.h"

namespace amaq {

// Reads the archive at `path` through `env`. Throws amaq::Error: kNotFound when the file cannot be
// read, kDataLoss naming `what` ("client checkpoint") when it is not an archive.
void ReadArchive(Env& env, const std::string& path, const std::string& what, torch::serialize::InputArchive& archive);

// Throws amaq::Error (kDataLoss) naming `path` and the first non-finite tensor's key
// ("optimizer/0/exp_avg" for nested archives). Reads the archive; changes nothing.
void RequireFiniteArchive(torch::serialize::InputArchive& archive, const std::string& path);

}  // namespace amaq
