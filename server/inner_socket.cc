#include "server/inner_socket.h"

#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/base/error.h"

namespace amaq::server {

InnerSocket::InnerSocket() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/amaq-server-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  Require(::mkdtemp(name.data()) != nullptr, ErrorCode::kUnavailable,
          pattern + ": cannot make the directory for gRPC's private socket (" + std::strerror(errno) +
              "): set TMPDIR to a writable directory");
  directory_ = name.data();  // mkdtemp makes it with mode 0700
  path_ = directory_ + "/grpc.sock";
  if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
    ::rmdir(directory_.c_str());
    throw Error(ErrorCode::kInvalidArgument, path_ + ": the path of gRPC's private socket is longer than " +
                                                 std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                                                 " bytes: set TMPDIR to a shorter directory");
  }
}

InnerSocket::~InnerSocket() {
  ::unlink(path_.c_str());
  ::rmdir(directory_.c_str());
}

}  // namespace amaq::server
