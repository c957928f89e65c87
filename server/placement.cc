#include "server/placement.h"

#include <xxhash.h>

#include "common/base/error.h"

namespace amaq::server {

int OwnerOf(const std::string& client_id, const std::vector<int>& ranks) {
  Require(!ranks.empty(), ErrorCode::kInternal, "OwnerOf needs at least one replica: please report this");
  int owner = ranks.front();
  uint64_t best = 0;
  bool first = true;
  for (const int rank : ranks) {
    const std::string key = client_id + std::string(1, '\0') + std::to_string(rank);
    const uint64_t weight = XXH3_64bits(key.data(), key.size());
    if (first || weight > best || (weight == best && rank < owner)) {
      owner = rank;
      best = weight;
      first = false;
    }
  }
  return owner;
}

}  // namespace amaq::server
