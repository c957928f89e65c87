#include "common/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/base/error.h"

namespace amaq {
namespace {

[[noreturn]] void Fail(const std::string& what, const std::string& path) {
  const int err = errno;
  throw Error(err == ENOSPC ? ErrorCode::kResourceExhausted : ErrorCode::kFailedPrecondition,
              "cannot " + what + " '" + path + "': " + std::strerror(err) +
                  "; the previous file, if any, is unchanged (free disk space or fix permissions)");
}

}  // namespace

void WriteFileAtomically(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  std::string temp = (std::filesystem::path(dir) / ("." + target.filename().string() + ".tmpXXXXXX")).string();
  const int fd = mkstemp(temp.data());
  if (fd < 0) Fail("create a temporary file next to", path);
  bool abandoned = false;  // the temporary file is closed and removed
  const auto abandon = [&](const char* what) {
    const int saved = errno;
    abandoned = true;
    close(fd);
    unlink(temp.c_str());
    errno = saved;
    Fail(what, path);
  };
  const ByteSink sink = [&](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
      const ssize_t n = write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) abandon("write");
      p += n;
      left -= static_cast<size_t>(n);
    }
  };
  try {
    produce(sink);
  } catch (...) {
    if (!abandoned) {
      close(fd);
      unlink(temp.c_str());
    }
    throw;
  }
  if (fsync(fd) != 0) abandon("flush");
  if (fchmod(fd, 0644) != 0) abandon("set permissions of");
  if (close(fd) != 0) {
    unlink(temp.c_str());
    Fail("close", path);
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(temp.c_str());
    errno = saved;
    Fail("rename into place", path);
  }
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
}

void WriteFileAtomically(const std::string& path,
                         const std::vector<std::pair<const void*, size_t>>& parts) {
  WriteFileAtomically(path, [&](const ByteSink& sink) {
    for (const auto& [data, size] : parts) sink(data, size);
  });
}

void RequireWritableDirectory(const std::string& dir, const std::string& key) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  Require(!ec, ErrorCode::kFailedPrecondition,
          "cannot create " + key + " '" + dir + "': " + ec.message() + ": choose a directory you can write");
  try {
    WriteFileAtomically(dir + "/.amaq-write-test", std::string());
  } catch (const Error& e) {
    throw Error(e.code(), key + " '" + dir + "' is not writable: " + e.what());
  }
  std::filesystem::remove(dir + "/.amaq-write-test", ec);
}

}  // namespace amaq
