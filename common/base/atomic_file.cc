#include "common/base/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "common/base/error.h"

namespace amaq {
namespace {

// A name next to `target` that no other writer, in this process or another, uses at the same time.
std::string TemporaryPath(const std::filesystem::path& target) {
  static std::atomic<uint64_t> next{0};
  return (target.parent_path() / ("." + target.filename().string() + ".tmp-" + std::to_string(getpid()) + "-" +
                                  std::to_string(next++)))
      .string();
}

}  // namespace

void WriteFileAtomically(const std::string& path, const std::function<void(const ByteSink&)>& produce, Env* env) {
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const std::string temp = TemporaryPath(target);
  try {
    const std::unique_ptr<WritableFile> file = env->NewWritableFile(temp);
    produce([&](const void* data, size_t size) { file->Append(data, size); });
    file->Sync();
    file->Close();
    env->RenameFile(temp, path);
  } catch (const Error& e) {
    env->RemoveFile(temp);
    throw Error(e.code(), std::string(e.what()) + "; the previous file '" + path + "', if any, is unchanged");
  } catch (...) {
    env->RemoveFile(temp);
    throw;
  }
  try {
    env->SyncDir(dir);  // the rename made durable
  } catch (const Error&) {
    // The new file is in place; a file system that cannot sync a directory leaves the rename to its
    // own flushing, as it always did here.
  }
}

void WriteFileAtomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts, Env* env) {
  WriteFileAtomically(path, [&](const ByteSink& sink) {
    for (const auto& [data, size] : parts) sink(data, size);
  }, env);
}

void RequireWritableDirectory(const std::string& dir, const std::string& key, Env* env) {
  try {
    env->CreateDirs(dir);
    WriteFileAtomically(dir + "/.amaq-write-test", std::string(), env);
  } catch (const Error& e) {
    throw Error(e.code(), key + " '" + dir + "' is not writable: " + e.what());
  }
  env->RemoveFile(dir + "/.amaq-write-test");
}

}  // namespace amaq
