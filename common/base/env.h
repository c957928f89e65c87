// Env: everything amaq's durable state does with files, and the clock its idle timeouts read, behind
// one interface (LevelDB's Env), so that a test can make the third rename of a checkpoint fail, or
// drop what was written but never synced, instead of filling a disk or killing a process.
//
// Env::Default() is the process's POSIX one; it lives for the whole program. Whatever takes an
// `Env*` (ServerOptions::env, ClientOptions::env, quant::CodecContext::env, WriteFileAtomically)
// does not own it: the Env must outlive its user. Every failure throws amaq::Error naming the path
// and saying what to do (a full disk is kResourceExhausted); nothing is half done that the error
// does not name. EnvWrapper forwards every call to another Env: a test's Env overrides the calls it
// wants to fail. Files and Envs may be used from several threads, one file by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace amaq {

// A file being written, from its start. Its bytes are durable only after Sync(); Close() releases
// it (the destructor closes one not closed, ignoring errors).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual void Append(const void* data, size_t size) = 0;
  virtual void Sync() = 0;
  virtual void Close() = 0;
};

// A file read from its start.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `size` bytes into `out`; returns how many (0 only at the end of the file).
  virtual size_t Read(void* out, size_t size) = 0;
};

// A file read at any offset (a checkpoint archive, read where its index points).
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to `size` bytes at `offset` into `out`; returns how many (fewer only at the end).
  virtual size_t Read(uint64_t offset, void* out, size_t size) const = 0;
  virtual uint64_t size() const = 0;
};

// A lock on a file (LevelDB's FileLock), held by this process until the object is destroyed or
// the process ends, however it ends.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Env() = default;
  static Env* Default();

  // A new file at `path` (mode 0644), replacing one that is there.
  virtual std::unique_ptr<WritableFile> NewWritableFile(const std::string& path) = 0;
  // kNotFound when `path` is missing or unreadable.
  virtual std::unique_ptr<SequentialFile> NewSequentialFile(const std::string& path) = 0;
  // kNotFound when `path` is missing or unreadable.
  virtual std::unique_ptr<RandomAccessFile> NewRandomAccessFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (same file system).
  virtual void RenameFile(const std::string& from, const std::string& to) = 0;
  // Returns whether there was a file to remove.
  virtual bool RemoveFile(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  // kNotFound when the file is missing.
  virtual uint64_t FileSize(const std::string& path) = 0;
  // The names (not paths) of the entries of `dir`; none when it does not exist.
  virtual std::vector<std::string> GetChildren(const std::string& dir) = 0;
  // Creates `dir` and its parents as needed.
  virtual void CreateDirs(const std::string& dir) = 0;
  // Makes the directory's entries (a rename into it) durable.
  virtual void SyncDir(const std::string& dir) = 0;
  // Takes the lock of `path` (created when absent) and writes `owner` into the file (who holds it:
  // a program and its pid). kFailedPrecondition naming the owner the file holds when another
  // process, or another FileLock of this one, holds the lock.
  virtual std::unique_ptr<FileLock> LockFile(const std::string& path, const std::string& owner) = 0;
  virtual Clock::time_point Now() = 0;
};

// Forwards every call to `target` (not owned, must outlive it).
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  std::unique_ptr<WritableFile> NewWritableFile(const std::string& path) override { return target_->NewWritableFile(path); }
  std::unique_ptr<SequentialFile> NewSequentialFile(const std::string& path) override {
    return target_->NewSequentialFile(path);
  }
  std::unique_ptr<RandomAccessFile> NewRandomAccessFile(const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  void RenameFile(const std::string& from, const std::string& to) override { target_->RenameFile(from, to); }
  bool RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  bool FileExists(const std::string& path) override { return target_->FileExists(path); }
  uint64_t FileSize(const std::string& path) override { return target_->FileSize(path); }
  std::vector<std::string> GetChildren(const std::string& dir) override { return target_->GetChildren(dir); }
  void CreateDirs(const std::string& dir) override { target_->CreateDirs(dir); }
  void SyncDir(const std::string& dir) override { target_->SyncDir(dir); }
  std::unique_ptr<FileLock> LockFile(const std::string& path, const std::string& owner) override {
    return target_->LockFile(path, owner);
  }
  Clock::time_point Now() override { return target_->Now(); }
  Env* target() const { return target_; }

 private:
  Env* target_;
};

}  // namespace amaq
