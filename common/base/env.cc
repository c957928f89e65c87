#include "common/base/env.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/base/error.h"

namespace amaq {
namespace {

[[noreturn]] void Fail(const std::string& what, const std::string& path, int err) {
  throw Error(err == ENOSPC || err == EDQUOT || err == EFBIG ? ErrorCode::kResourceExhausted : ErrorCode::kFailedPrecondition,
              "cannot " + what + " '" + path + "': " + std::strerror(err) + " (free disk space or fix permissions)");
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
  }
  void Append(const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Fail("write", path_, n < 0 ? errno : ENOSPC);
      p += n;
      size -= static_cast<size_t>(n);
    }
  }
  void Sync() override {
    if (fsync(fd_) != 0) Fail("flush", path_, errno);
  }
  void Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) Fail("close", path_, errno);
  }

 private:
  std::string path_;
  int fd_;
};

class PosixSequentialFile : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { close(fd_); }
  size_t Read(void* out, size_t size) override {
    for (;;) {
      const ssize_t n = read(fd_, out, size);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) Fail("read", path_, errno);
    }
  }

 private:
  std::string path_;
  int fd_;
};

class PosixRandomAccessFile : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixRandomAccessFile() override { close(fd_); }
  size_t Read(uint64_t offset, void* out, size_t size) const override {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pread(fd_, static_cast<char*>(out) + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) Fail("read", path_, errno);
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }
  uint64_t size() const override { return size_; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

// flock() on an open descriptor: held until the descriptor closes, whichever way the process ends.
class PosixFileLock : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { close(fd_); }

 private:
  int fd_;
};

// Opens `path` for reading: kNotFound, saying to check the path, when it cannot.
int OpenForReading(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kNotFound, "cannot read '" + path + "': " + std::strerror(errno) + ": check the path");
  return fd;
}

class PosixEnv : public Env {
 public:
  std::unique_ptr<WritableFile> NewWritableFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Fail("create", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }
  std::unique_ptr<SequentialFile> NewSequentialFile(const std::string& path) override {
    return std::make_unique<PosixSequentialFile>(path, OpenForReading(path));
  }
  std::unique_ptr<RandomAccessFile> NewRandomAccessFile(const std::string& path) override {
    const int fd = OpenForReading(path);
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      Fail("read the size of", path, err);
    }
    return std::make_unique<PosixRandomAccessFile>(path, fd, static_cast<uint64_t>(st.st_size));
  }
  void RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) Fail("rename into place", to, errno);
  }
  bool RemoveFile(const std::string& path) override { return unlink(path.c_str()) == 0; }
  bool FileExists(const std::string& path) override { return access(path.c_str(), F_OK) == 0; }
  uint64_t FileSize(const std::string& path) override {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    Require(!ec, ErrorCode::kNotFound, "cannot read the size of '" + path + "': " + ec.message() + ": check the path");
    return size;
  }
  std::vector<std::string> GetChildren(const std::string& dir) override {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) names.push_back(entry.path().filename().string());
    return names;
  }
  void CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    Require(!ec, ErrorCode::kFailedPrecondition,
            "cannot create directory '" + dir + "': " + ec.message() + ": choose a directory you can write");
  }
  void SyncDir(const std::string& dir) override {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) Fail("open directory", dir, errno);
    const int synced = fsync(fd), err = errno;
    close(fd);
    if (synced != 0) Fail("flush directory", dir, err);
  }
  std::unique_ptr<FileLock> LockFile(const std::string& path, const std::string& owner) override {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) Fail("create the lock file", path, errno);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char held[256] = {};
      const ssize_t n = pread(fd, held, sizeof held - 1, 0);
      close(fd);
      if (err != EWOULDBLOCK) Fail("lock", path, err);
      throw Error(ErrorCode::kFailedPrecondition,
                  "'" + path + "' is locked by " + (n > 0 ? std::string(held, static_cast<size_t>(n)) : "another process"));
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, owner.data(), owner.size(), 0) != static_cast<ssize_t>(owner.size())) {
      const int err = errno;
      close(fd);
      Fail("write the lock file", path, err);
    }
    return std::make_unique<PosixFileLock>(fd);
  }
  Clock::time_point Now() override { return Clock::now(); }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv;  // never destroyed: threads may use it until exit
  return env;
}

}  // namespace amaq
