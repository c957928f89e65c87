#include "common/net/host_port.h"

#include "common/base/error.h"

namespace amaq {

std::pair<std::string, uint16_t> SplitHostPort(const std::string& address, const std::string& key) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      port = -1;
    }
  }
  Require(port >= 0 && port < 65536, ErrorCode::kInvalidArgument,
          "'" + key + "' must be host:port (e.g. localhost:50051), got '" + address + "'");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace amaq
