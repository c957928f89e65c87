#include "server/token_store.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>

#include "common/error.h"

namespace amaq::server {

TokenStore::TokenStore(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  Require(std::filesystem::exists(path_), ErrorCode::kNotFound,
          path_ + ": tokens file not found: create it with one \"client_id token\" line per client");
  ReloadIfChanged();
  Require(!client_of_.empty(), ErrorCode::kInvalidArgument,
          path_ + ": the tokens file holds no \"client_id token\" line: no client could connect");
}

void TokenStore::ReloadIfChanged() {
  std::error_code ec;
  const auto stamp = std::filesystem::last_write_time(path_, ec);
  if (ec || stamp == loaded_at_) return;
  std::ifstream in(path_);
  std::map<std::string, std::string> fresh;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string client, token, extra;
    fields >> client >> token;
    if (client.empty()) continue;
    if (token.size() < 16 || (fields >> extra)) {
      spdlog::error("{}:{}: expected \"client_id token\" with a token of 16 or more characters; line ignored", path_, number);
      continue;
    }
    fresh[token] = client;
  }
  client_of_.swap(fresh);
  loaded_at_ = stamp;
  spdlog::info("loaded {} client tokens from {}", client_of_.size(), path_);
}

std::optional<std::string> TokenStore::ClientOf(const std::string& token) {
  std::lock_guard<std::mutex> lock(mutex_);
  ReloadIfChanged();
  const auto it = client_of_.find(token);
  if (it == client_of_.end()) return std::nullopt;
  return it->second;
}

}  // namespace amaq::server
