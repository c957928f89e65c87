// TokenStore: the bearer tokens a server accepts, from a file of "client_id token" lines, or
// "client_id token admin" for an operator's token (# starts a comment). A request's
// "authorization: Bearer <token>" metadata names the client it acts as; an unknown, missing or
// revoked token is refused with UNAUTHENTICATED. The file is read again when it changes, so
// removing a line revokes a token without a restart; a file that disappears revokes every token
// (fail closed) until it is back.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace amaq::server {

class TokenStore {
 public:
  // An empty path accepts every request as the client it claims to be (tests, trusted networks).
  explicit TokenStore(std::string path);
  bool enabled() const { return !path_.empty(); }
  struct Owner {
    std::string client;
    bool admin = false;  // may see every client (Status)
  };
  // Whom a bearer token belongs to; nullopt when it is not (or no longer) valid.
  std::optional<Owner> OwnerOf(const std::string& token);

 private:
  void ReloadIfChanged();
  std::string path_;
  std::mutex mutex_;
  std::filesystem::file_time_type loaded_at_{};
  bool missing_ = false;  // the file was gone at the last look (logged once)
  std::map<std::string, Owner> owner_of_;  // token -> owner
};

}  // namespace amaq::server
