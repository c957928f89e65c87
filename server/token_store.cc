#include "server/token_store.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>

#include "common/base/error.h"

namespace amaq::server {

TokenStore::TokenStore(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  Require(std::filesystem::exists(path_), ErrorCode::kNotFound,
          path_ + ": tokens file not found: create it with one \"client_id token\" line per client");
  ReloadIfChanged();
  Require(!owner_of_.empty(), ErrorCode::kInvalidArgument,
          path_ + ": the tokens file holds no \"client_id token\" line: no client could connect");
}

void TokenStore::ReloadIfChanged() {
  std::error_code ec;
  const auto stamp = std::filesystem::last_write_time(path_, ec);
  if (ec) {  // deleted or unreadable: refuse everyone rather than keep what was loaded
    if (!missing_) {
      spdlog::error("{}: the tokens file is gone ({}): every token is refused until it is back", path_, ec.message());
    }
    missing_ = true;
    owner_of_.clear();
    loaded_at_ = {};
    return;
  }
  if (stamp == loaded_at_ && !missing_) return;
  missing_ = false;
  std::ifstream in(path_);
  std::map<std::string, Owner> fresh;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string client, token, role, extra;
    fields >> client >> token >> role;
    if (client.empty()) continue;
    if (token.size() < 16 || !(role.empty() || role == "admin") || (fields >> extra)) {
      spdlog::error("{}:{}: expected \"client_id token\" or \"client_id token admin\" with a token of 16 or more "
                    "characters; line ignored",
                    path_, number);
      continue;
    }
    fresh[token] = Owner{client, role == "admin"};
  }
  owner_of_.swap(fresh);
  loaded_at_ = stamp;
  spdlog::info("loaded {} client tokens from {}", owner_of_.size(), path_);
}

std::optional<TokenStore::Owner> TokenStore::OwnerOf(const std::string& token) {
  std::lock_guard<std::mutex> lock(mutex_);
  ReloadIfChanged();
  const auto it = owner_of_.find(token);
  if (it == owner_of_.end()) return std::nullopt;
  return it->second;
}

}  // namespace amaq::server
