// ReplicaSync: keeps the shared server LoRA (shared_lora) one model across the replicas of a run
// (server/replica_group.h), by parameter averaging: every replica_sync_seconds each replica takes
// the mean of the shared LoRA over the replicas. Steps do not wait for it: the LoRA is copied
// under the server's step lock, averaged over the group without it, and then, under the lock,
// each value becomes mean + (value now - value copied), so steps applied during the average are
// kept. A replica where no step ran meanwhile holds exactly the mean: after a synchronisation of
// quiet replicas every replica holds the same bits. Each replica's AdamW moments stay its own.
// A synchronisation that fails (a replica went away or was replaced) changes nothing, is logged
// and counted, and the group is formed again (Reform) before the next one. Per-client LoRA needs
// no synchronisation: a client's session lives on one replica.
//
// Lifetime: the server and the group must outlive the ReplicaSync; its thread runs from the
// constructor (first synchronisation after one interval) to the destructor, which cancels the
// group's waiting (ReplicaGroup::Cancel: the group cannot form again afterwards) and waits for an
// average in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "server/replica_group.h"
#include "server/split_server.h"

namespace amaq::server {

// What every replica of a run must hold equal (ReplicaGroup refuses a replica whose fields differ
// from rank 0's): the model and cut (the fingerprint), the base weights, the LoRA's shape and
// initialisation, the optimizer's settings and whether the LoRA is shared.
ReplicaIdentity IdentityOf(const SplitServer& server, const ServerOptions& options);

class ReplicaSync {
 public:
  ReplicaSync(SplitServer& server, ReplicaGroup& group, double every_seconds);
  ~ReplicaSync();
  ReplicaSync(const ReplicaSync&) = delete;
  ReplicaSync& operator=(const ReplicaSync&) = delete;

  // One synchronisation now, as the thread runs it (every replica must call it: it meets the
  // others in the group's collective). Returns false, having changed nothing, when it failed.
  bool SynchronizeNow();
  int64_t synchronisations() const { return synchronisations_; }
  int64_t failures() const { return failures_; }

 private:
  void Loop();

  SplitServer& server_;
  ReplicaGroup& group_;
  const double every_seconds_;
  std::atomic<int64_t> synchronisations_{0}, failures_{0};
  std::mutex sync_mutex_;  // one synchronisation at a time (the thread's, a caller's)
  bool reform_ = false;    // the last synchronisation failed: form the group again first (sync_mutex_)
  std::mutex mutex_;       // stop_, for the thread's wait
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above is set
};

}  // namespace amaq::server
