#include "common/net/host_port.h"

#include "common/base/error.h"

namespace amaq {

std::pair<std::string, uint16_t> SplitHostPort(const std::string& address, const std::string& key) {
  const size_t colon = address.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : address.substr(colon + 1);
  Require(colon != std::string::npos && colon > 0 && !digits.empty() && digits.size() <= 9 &&
              digits.find_first_not_of("0123456789") == std::string::npos,
          ErrorCode::kInvalidArgument, "'" + key + "' must be host:port (e.g. localhost:50051), got '" + address + "'");
  const int port = std::stoi(digits);
  Require(port < 65536, ErrorCode::kInvalidArgument,
          "'" + key + "': port must be 1..65535 (0 where it listens: any free port), got " + digits);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace amaq
