// ReplicaGroup: one amaq-server's place among the replicas that serve one run (docs/deploy.md),
// on PyTorch's collective engine c10d: no rendezvous or collective of amaq's own.
//
// Ranks 0..replicas-1 meet at a c10d TCPStore that rank 0 hosts (`rendezvous`, host:port). Each
// checks that it serves the same run as rank 0 (its ReplicaIdentity and `replicas`: every field
// equal, or a refusal naming each field that differs with both values), publishes its public
// address, and joins a Gloo process group (c10d::ProcessGroupGloo over TCP).
//
// Generations: every Join (a replica's start, or its replacement after a crash) and every Reform
// adds one to the store's generation counter. The group of generation g forms under the store
// prefix "g/<g>/" once every rank has arrived at g; a replica that sees a newer generation moves
// on to it, so replicas started one after another all meet at the newest. When a replica is replaced, the
// others keep running: their next collective is refused (kFailedPrecondition, naming both
// generations) until they call Reform, which forms the group again at the newest generation.
// A replica behind the newest generation never mixes its tensors into a newer group.
//
// Lifetime: Join and Reform block until the group has formed, or throw kUnavailable after
// timeout_seconds naming the ranks that did not arrive (and a refusal a rank left in the store).
// Rank 0's store lives as long as rank 0's ReplicaGroup: when rank 0 restarts, the other
// replicas' next Reform connects to its new store (whose generations count afresh).
// Not thread-safe: one thread at a time, except generation(), addresses(), OwnerAddress and Cancel.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace amaq::server {

struct ReplicaOptions {
  int replicas = 1;            // how many replicas serve the run
  int rank = 0;                // this replica's place, 0..replicas-1 (rank 0 hosts the store)
  std::string rendezvous;      // host:port of rank 0's store (rank 0 listens on that port)
  std::string public_address;  // where clients reach this replica (host:port), told to the others
  double timeout_seconds = 120;  // for the group to form, and for one collective
};

// What must be equal on every replica of a run, as (name, value) pairs in a fixed order (the
// server's: server/replica_sync.h, IdentityOf).
using ReplicaIdentity = std::vector<std::pair<std::string, std::string>>;

class ReplicaGroup {
 public:
  // Connects to (rank 0: starts) the store, checks `identity` against rank 0's, and forms the
  // group at the newest generation. kInvalidArgument for bad options; kFailedPrecondition when
  // the identity differs from rank 0's; kUnavailable when the group did not form in time.
  static std::unique_ptr<ReplicaGroup> Join(const ReplicaOptions& options, const ReplicaIdentity& identity);
  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.replicas; }
  // The generation this replica's group formed at, and each rank's public address in it.
  int64_t generation() const { return generation_; }
  std::vector<std::string> addresses() const;
  // The public address of the replica that serves `client_id` (server/placement.h, over every rank
  // of the set), or empty when this one does.
  std::string OwnerAddress(const std::string& client_id) const;
  // The store's newest generation: above generation() when a replica joined since this group formed.
  int64_t NewestGeneration();
  // Forms the group again at the newest generation (after a refusal, or a collective that failed
  // because a replica went away). Throws as Join does.
  void Reform();
  // Replaces each tensor (float32, contiguous, on the CPU) by its element-wise mean over the
  // replicas; every replica ends with the same bits. kFailedPrecondition when a newer generation
  // exists (Reform first); kUnavailable when a replica failed during the collective.
  void AverageInPlace(const std::vector<torch::Tensor>& tensors);
  // From any thread: a Join or Reform waiting for the others now, or from now on, throws
  // kUnavailable ("stopping") instead of waiting on (the server is stopping).
  void Cancel() { cancelled_ = true; }

 private:
  struct Store;
  ReplicaGroup(ReplicaOptions options, ReplicaIdentity identity);
  void Connect();           // the store: started by rank 0, reached by the others
  void CheckIdentity();     // against rank 0's (rank 0 writes it)
  void Form();              // at the newest generation; sets generation_, addresses_, group_

  ReplicaOptions options_;
  ReplicaIdentity identity_;
  std::unique_ptr<Store> store_;  // the c10d store and this generation's process group
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> generation_{0};
  mutable std::mutex addresses_mutex_;
  std::vector<std::string> addresses_;  // of generation_ (addresses_mutex_)
};

// The fields of `mine` that differ from `theirs` ("cut_layer: 2 here, 3 at rank 0"), joined with
// "; "; empty when equal. A field that only one side has counts as differing.
std::string IdentityDifferences(const ReplicaIdentity& mine, const ReplicaIdentity& theirs);

}  // namespace amaq::server
