// Placement of clients on the replicas of a run (docs/protocol.md, "Replicas"). Each client_id
// belongs to one replica, chosen by rendezvous (highest-random-weight) hashing over the ranks of
// the replica set: the rank r with the largest XXH3-64 of client_id, a zero byte and r in decimal
// (ties, which a 64-bit hash makes unlikely, go to the lower rank). The choice needs no table and
// no coordination, and a change of the set moves only the clients of a replica that left (each to
// its next-highest rank) or joined (from the others): every other client stays where it was.
#pragma once

#include <string>
#include <vector>

namespace amaq::server {

// The rank in `ranks` (not empty; any order) that owns `client_id`.
int OwnerOf(const std::string& client_id, const std::vector<int>& ranks);

}  // namespace amaq::server
