#include "common/model/archive_check.h"

#include <torch/torch.h>

#include "common/base/error.h"

namespace amaq {
namespace {

void CheckTensors(torch::serialize::InputArchive& archive, const std::string& prefix, const std::string& path) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor t;
    if (archive.try_read(key, t)) {
      Require(!t.is_floating_point() || torch::isfinite(t).all().item<bool>(), ErrorCode::kDataLoss,
              path + ": tensor '" + prefix + key + "' holds NaN or an infinity: the checkpoint is corrupt; restore a " +
                  "backup or move it away to start fresh");
      continue;
    }
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested)) CheckTensors(nested, prefix + key + "/", path);
  }
}

}  // namespace

void ReadArchive(Env& env, const std::string& path, const std::string& what, torch::serialize::InputArchive& archive) {
  const std::unique_ptr<RandomAccessFile> file = env.NewRandomAccessFile(path);
  try {  // read where the archive's index points, not copied whole into memory first
    archive.load_from([&](uint64_t offset, void* out, size_t size) { return file->Read(offset, out, size); },
                      [&] { return static_cast<size_t>(file->size()); });
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kDataLoss, path + ": " + what + " is unreadable (" + e.what_without_backtrace() +
                                          "): move it away to start fresh");
  }
}

void RequireFiniteArchive(torch::serialize::InputArchive& archive, const std::string& path) {
  CheckTensors(archive, "", path);
}

}  // namespace amaq
