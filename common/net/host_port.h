// "host:port" addresses as settings write them (IPv6 hosts in brackets: "[::1]:50051").
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace amaq {

// Splits "host:port"; throws amaq::Error (kInvalidArgument) naming the setting `key` when malformed.
std::pair<std::string, uint16_t> SplitHostPort(const std::string& address, const std::string& key);

}  // namespace amaq
