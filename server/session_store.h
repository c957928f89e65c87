// SessionStore: the server's client sessions and where they live.
//
// A session is one client's state between steps: its method and server codec (both codec streams,
// the AQ-SGD cache), its step counter, the answers to its last applied steps, its decoding cache,
// and its own server LoRA with its optimizer (or, with shared_lora, a share of the one LoRA every
// client trains, which the store holds too). Sessions live in memory; a checkpoint writes all of
// them, with the shared LoRA and the clients' adapter uploads (collaborative mode), atomically to
// checkpoint_dir/server.pt; an evicted session (idle past session_ttl_seconds, or moved out to keep
// max_sessions_memory_mb) goes to its own file under checkpoint_dir/sessions/ and comes back at its
// client's next Join; AQ-SGD histories are files of their own under checkpoint_dir/histories/.
// Every file goes through ServerOptions::env. The store loads the checkpoint when it is built, and
// holds checkpoint_dir/LOCK while it lives (one store, one server, per checkpoint_dir: another
// is refused, kInvalidArgument naming the holder's pid).
//
// Locks. The server's step lock (held by SplitServer while a step, checkpoint, eviction or adapter
// call runs) guards what is inside sessions; the store's own lock guards which sessions exist and
// the statistics Stats() shows, and is never held while a step computes. Methods say which they
// need: "step lock" means the caller holds it; the store takes its own lock itself. A Session&
// stays valid while the caller holds the step lock (only eviction and Forget remove sessions, and
// both need it). A failed write throws amaq::Error and leaves every session in memory as it was.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/env.h"
#include "common/base/split_step.h"
#include "common/model/model.h"
#include "quant/cut_codec.h"
#include "quant/method.h"
#include "server/server_options.h"

namespace amaq::server {

struct ClientStats {
  int64_t steps = 0;             // TRAIN steps applied (kept in checkpoints: a step applied twice shows)
  uint64_t activation_bytes = 0; // codec bytes received
  uint64_t gradient_bytes = 0;   // codec bytes sent
  float last_loss = 0;
  double average_bits = 0;
  double last_step_seconds = 0;
  std::string method;            // canonical
};

struct LoraState {
  std::vector<torch::Tensor> values;  // leaves that require gradients, in TrainableParameters() order
  std::unique_ptr<torch::optim::AdamW> optimizer;  // over values
};

struct Session {
  using Clock = Env::Clock;
  std::string client_id;
  std::string method_text;                  // canonical; empty until the first Join
  std::string run;                          // JoinInfo::run of the run it holds; empty: none given yet
  std::unique_ptr<quant::ServerCodec> codec;
  std::unique_ptr<LoraState> own;           // per-client LoRA (null when shared)
  int64_t last_applied = -1;
  // The answers to the parts of the last kAnswersKept applied steps (a client one step stale has
  // two in flight), oldest first, kept to answer a retry of them: the replies, and the raw gradients,
  // encoded again on the current stream (a rejoined client's decoder does not know the old
  // stream's bits table).
  struct Answers {
    int64_t step;
    std::vector<StepResult> replies;
    std::vector<torch::Tensor> gradients;  // fp32, CPU, [rows, hidden]
  };
  std::deque<Answers> applied;
  // The step whose parts are arriving (-1: none): the parts so far have added their gradients to
  // the LoRA's and are answered (their answers kept as above); partial_loss sums their losses.
  int64_t partial_step = -1;
  int32_t partial_parts = 0;
  std::vector<StepResult> partial_replies;
  std::vector<torch::Tensor> partial_gradients;
  float partial_loss = 0;
  Clock::time_point last_step_at{};         // of the last applied TRAIN step
  Clock::time_point last_seen{};            // of the last call of this client (session_ttl_seconds), by the Env's clock
  ClientStats stats;
  // NEXT_TOKEN steps with a decoding cache: the server part's keys and values of the sequences
  // being decoded (started by START_CACHE; dropped by any other step, a rejoin, or a failure).
  std::unique_ptr<KvCache> decode_cache;
};

class SessionStore {
 public:
  // `options` and `config` must outlive the store; `initial_lora` is every new LoRA's start (in
  // the server part's TrainableParameters() order). Loads checkpoint_dir/server.pt when there is one
  // (kDataLoss when it is unreadable: the message says to move it away).
  SessionStore(const ServerOptions& options, const ModelConfig& config, std::vector<torch::Tensor> initial_lora);
  ~SessionStore();

  // Joins `client_id` when its session is not in memory (loading an evicted one, or starting one)
  // and returns its last applied step; nullopt, having done nothing, when the session is in memory
  // (then call Join under the step lock). Throws as Join.
  std::optional<int64_t> JoinAbsent(const std::string& client_id, const quant::Method& method, const std::string& run,
                                    RunStart start);
  // Step lock. Joins `client_id`, in memory or not: a kContinue `run` that differs from the
  // session's is kFailedPrecondition, another method kInvalidArgument. Its codec streams start
  // afresh (AQ-SGD caches survive), its decoding cache is dropped.
  int64_t Join(const std::string& client_id, const quant::Method& method, const std::string& run, RunStart start);
  // Step lock. Drops the session of `client_id` from memory and its files (an evicted copy, the
  // AQ-SGD history), and then writes the checkpoint without it; returns whether there was any.
  bool Forget(const std::string& client_id);

  // The joined session of `client_id`, its last call now (kFailedPrecondition when it has not
  // joined or was evicted). Step lock for what is inside.
  Session& Joined(const std::string& client_id);
  LoraState& LoraOf(Session& s) { return s.own ? *s.own : *shared_; }
  // Step lock. The LoRA every client trains with shared_lora (null without it).
  LoraState* shared() { return shared_.get(); }
  // Step lock. Makes the sessions' statistics what Stats() shows and counts their bytes.
  void Publish(const std::vector<const Session*>& sessions);
  std::map<std::string, ClientStats> Stats() const;

  // Step lock. Makes room for `adds` more bytes of `s`'s session by evicting the least recently
  // seen sessions outside `batch` and not amid a step sent in parts, then checkpointing; throws
  // kResourceExhausted, having moved nothing, when that cannot make room (max_sessions_memory_mb).
  void KeepWithinBudget(const std::set<std::string>& batch, const Session& s, const StepInput& in, uint64_t adds);
  // Step lock. Evicts the sessions idle for session_ttl_seconds, except those of `connected`
  // clients, then checkpoints; returns how many. A failed write keeps the session in memory and throws.
  int EvictIdle(const std::set<std::string>& connected);
  // The state of `s` that max_sessions_memory_mb counts, in bytes (step lock).
  static uint64_t SessionBytes(const Session& s);
  // The bytes of a decoding cache's keys, values and mask (0 for none).
  static uint64_t HeldBytes(const KvCache* cache);

  // Step lock. Writes the checkpoint (no-op without a checkpoint_dir); throws amaq::Error when it
  // cannot, the previous checkpoint intact, saying how many applied steps that one lacks.
  void Checkpoint();
  // Step lock. Counts an applied step, and checkpoints once checkpoint_every have been applied;
  // a failure there is logged and counted, not thrown (the next step tries again).
  void NoteApplied() { ++applied_since_checkpoint_; }
  void CheckpointIfDue();

  // Collaborative mode: stores `tensors` as the client's latest adapter upload (kept in the
  // checkpoint) and returns every client's latest, valid until the next call. Step lock.
  std::vector<const NamedFloats*> StoreUpload(const std::string& client_id, const NamedFloats& tensors);

  size_t in_memory() const;
  uint64_t memory_bytes() const { return memory_bytes_; }
  int64_t evicted() const { return evicted_; }
  int64_t checkpoint_failures() const { return checkpoint_failures_; }

 private:
  using Clock = Env::Clock;
  std::unique_ptr<LoraState> NewLoraState() const;
  quant::CodecContext CodecContextFor(const std::string& client_id) const;
  int64_t JoinLocked(const std::string& client_id, const quant::Method& method, const std::string& run, RunStart start);
  void PublishLocked(const Session& s);
  void TryCheckpoint();
  // Writes the session of `id` to its file under checkpoint_dir/sessions/ and drops it from
  // memory (the caller holds both locks and rewrites the checkpoint).
  void EvictLocked(const std::string& id, const std::string& why);
  void LoadCheckpoint();
  // A session's state under "client.<id>." in an archive, and back (a session with its method set).
  void SaveSession(torch::serialize::OutputArchive& archive, Session& s) const;
  std::unique_ptr<Session> LoadSession(torch::serialize::InputArchive& archive, const std::string& id) const;
  // A session's stored answers (Session::applied) under `key`, and back.
  static void SaveAnswers(torch::serialize::OutputArchive& archive, const std::string& key, const Session& s);
  void LoadAnswers(torch::serialize::InputArchive& archive, const std::string& key, Session& s) const;
  std::string CheckpointPath() const;
  std::string EvictedPath(const std::string& client_id) const;
  // The evicted session of `client_id`, or null; its file stays until a checkpoint holds the session.
  std::unique_ptr<Session> LoadEvicted(const std::string& client_id) const;

  const ServerOptions& options_;
  const ModelConfig& config_;
  Env& env_;
  std::unique_ptr<FileLock> lock_;  // of checkpoint_dir/LOCK, while the store lives
  std::vector<torch::Tensor> initial_lora_;
  std::unique_ptr<LoraState> shared_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  std::map<std::string, NamedFloats> uploads_;  // collaborative mode: each client's latest adapter
  int64_t applied_since_checkpoint_ = 0;  // the applied steps the checkpoint on disk lacks
  bool checkpoints_failing_ = false;  // since the last failed checkpoint (step lock)
  Clock::time_point last_failure_logged_{};
  std::atomic<int64_t> checkpoint_failures_{0};
  std::atomic<int64_t> evicted_{0};
  std::atomic<uint64_t> memory_bytes_{0};
  // Which sessions exist (a first Join adds one under this lock alone, so that clients join while
  // a step computes) and published_; taken after the step lock, never before it.
  mutable std::mutex mutex_;
  std::map<std::string, ClientStats> published_;  // Stats(): each session's, as of its last step or Join
};

}  // namespace amaq::server
