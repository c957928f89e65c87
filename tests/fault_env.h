// FaultEnv: an Env (common/base/env.h) for tests that fails the N-th write, sync or rename of the
// files whose path contains a given text, remembers how much of each file it wrote was synced, and
// can then drop the rest as a power cut would (LevelDB's FaultInjectionTestEnv). Its clock runs
// `Advance`d seconds ahead of the real one. Forwards everything else to Env::Default().
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/base/env.h"
#include "common/base/error.h"

namespace amaq::testing {

class FaultEnv : public EnvWrapper {
 public:
  enum class Op { kWrite, kSync, kRename };

  FaultEnv() : EnvWrapper(Env::Default()) {}

  // The `n`-th `op` from now (1: the next) on a path containing `path_part` throws
  // kResourceExhausted, as a full disk would; the ones before and after it succeed.
  void FailNth(Op op, std::string path_part, int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    fault_ = Fault{op, std::move(path_part), n};
  }
  // How many failures were injected so far.
  int injected() const { return injected_; }

  // Truncates every file this Env wrote to what was synced of it (a rename carries the count).
  void DropUnsyncedData() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [path, synced] : synced_) {
      if (std::filesystem::exists(path)) std::filesystem::resize_file(path, synced);
    }
  }

  void Advance(double seconds) { offset_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)); }
  Clock::time_point Now() override { return target()->Now() + offset_; }

  std::unique_ptr<WritableFile> NewWritableFile(const std::string& path) override {
    auto file = std::make_unique<File>(*this, path, target()->NewWritableFile(path));
    std::lock_guard<std::mutex> lock(mutex_);
    synced_[path] = 0;
    return file;
  }
  void RenameFile(const std::string& from, const std::string& to) override {
    MaybeFail(Op::kRename, to);
    target()->RenameFile(from, to);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = synced_.find(from);
    if (it == synced_.end()) return;
    synced_[to] = it->second;
    synced_.erase(from);
  }

 private:
  struct Fault {
    Op op;
    std::string path_part;
    int n = 0;  // 0: none pending
  };

  class File : public WritableFile {
   public:
    File(FaultEnv& env, std::string path, std::unique_ptr<WritableFile> file)
        : env_(env), path_(std::move(path)), file_(std::move(file)) {}
    void Append(const void* data, size_t size) override {
      env_.MaybeFail(Op::kWrite, path_);
      file_->Append(data, size);
      written_ += size;
    }
    void Sync() override {
      env_.MaybeFail(Op::kSync, path_);
      file_->Sync();
      std::lock_guard<std::mutex> lock(env_.mutex_);
      env_.synced_[path_] = written_;
    }
    void Close() override { file_->Close(); }

   private:
    FaultEnv& env_;
    std::string path_;
    std::unique_ptr<WritableFile> file_;
    uint64_t written_ = 0;
  };

  void MaybeFail(Op op, const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fault_.n == 0 || fault_.op != op || path.find(fault_.path_part) == std::string::npos || --fault_.n > 0) return;
    ++injected_;
    throw Error(ErrorCode::kResourceExhausted, "injected failure on '" + path + "' (FaultEnv)");
  }

  std::mutex mutex_;
  Fault fault_;
  int injected_ = 0;
  std::map<std::string, uint64_t> synced_;  // bytes synced of each file written here, by its current path
  Clock::duration offset_{0};
};

}  // namespace amaq::testing
