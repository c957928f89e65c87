// SplitServer: the server's half of split training, independent of the network layer.
//
// It holds layers [cut, L), the final norm and the head of a Hugging Face model, with LoRA, on the
// configured device. Each joined client has a session: its quantization method and the method's
// server codec (quant/cut_codec.h: both codec streams, the AQ-SGD cache), its step counter and the
// reply of its last step; and either its own server LoRA with its own optimizer or a share of one
// LoRA common to all clients. A step runs in stages:
//   admit    the fields are checked; a step whose estimated memory (server/step_cost.h) exceeds
//            max_step_memory_mb, or with the decoding cache it leaves max_client_memory_mb, is
//            refused (kResourceExhausted, naming the limit); a step that would take every session's
//            state past max_sessions_memory_mb first moves the least recently seen other sessions
//            to disk, and is refused (kResourceExhausted) when that cannot make room;
//            a retry of the last applied step is answered from the stored
//            reply; a gap in step ids is refused; a TRAIN step sooner than 1/max_steps_per_second
//            after the client's last applied one is refused (kResourceExhausted: retry later);
//   decode   the activation, by the session's codec (its streams advance with every message
//            decoded, as the client's did when it encoded it);
//   compute  evaluation steps: scores or next tokens (with a decoding cache kept per client for
//            NEXT_TOKEN steps that ask for one: the server part's keys and values, bounded by
//            max_sequence_tokens and max_batch_tokens, dropped by any other step); TRAIN: forward, loss (a loss that is not
//            finite is refused), backward, the gradient encoded;
//   commit   TRAIN: the optimizer steps, the step counter, statistics and stored reply move on.
// Join, Stats and ReportMetric of other clients are answered while a step computes.
// A step refused at any stage leaves the LoRA, the optimizer, the step counter and the statistics
// as they were (only the activation bytes it carried are counted as received). Steps are applied
// once: a repeated step id below the last one (a replay after the server restarted) is answered but
// not applied. Steps, or batches of steps of different clients (StepBatch), run one at a time (one
// model, one device). The part's own LoRA tensors only hold the seeded start: every forward runs
// the LoRA of a session (or the shared one) as row groups.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/model/lora.h"
#include "common/model/model.h"
#include "common/base/split_step.h"
#include "quant/cut_codec.h"
#include "quant/method.h"
#include "server/adapter_average.h"
#include "server/run_history.h"
#include "server/step_cost.h"

namespace amaq::server {

// The defaults here are amaq-server's (server/server_config.cc declares the keys that set them).
struct ServerOptions {
  std::string model_dir = "models/amaq-base";
  int64_t cut_layer = 2;
  std::string device = "auto";  // auto | cpu | cuda
  std::string base_weights = "fp32";  // fp32 | bf16 | nf4 | int8 (common/model/base_weights.h); clients must match
  LoraConfig lora;
  double lr = 2e-3;
  double max_grad_norm = 0;  // clip the server LoRA's gradient norm per step (0: no clipping)
  bool shared_lora = false;
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 100;  // applied training steps (all clients) between checkpoints
  int64_t max_batch_tokens = 65536;
  int64_t max_sequence_tokens = 0;  // tokens per row; 0: the model's max_position_embeddings (never more)
  double max_steps_per_second = 0;  // per client; 0: no limit (RESOURCE_EXHAUSTED above it)
  // Budgets of a step's estimated memory (server/step_cost.h), alone and with the decoding cache it
  // leaves its client; 0: a quarter and a half of the device's memory (RESOURCE_EXHAUSTED above them).
  int64_t max_step_memory_mb = 0, max_client_memory_mb = 0;
  int64_t aqsgd_cache_mb = 1024;
  std::string aqsgd_spill_dir;
  // A session whose client has had no open stream and sent nothing for this long is written to
  // checkpoint_dir/sessions/ and dropped from memory; its client's next Join loads it (0: never).
  double session_ttl_seconds = 0;
  // All sessions' state together: decoding caches, AQ-SGD caches in memory, stored replies, the
  // per-client LoRA with its optimizer (0: no bound). Past it, a step first moves the least
  // recently seen sessions (not those of its batch) to checkpoint_dir/sessions/ as session_ttl_seconds
  // does; without checkpoint_dir, or with nothing left to move, the step is refused.
  double max_sessions_memory_mb = 0;
  AverageOptions averaging;  // collaborative mode's aggregate of the clients' adapters
  uint64_t seed = 1;
};

struct ClientStats {
  int64_t steps = 0;             // TRAIN steps applied (kept in checkpoints: a step applied twice shows)
  uint64_t activation_bytes = 0; // codec bytes received
  uint64_t gradient_bytes = 0;   // codec bytes sent
  float last_loss = 0;
  double average_bits = 0;
  double last_step_seconds = 0;
  std::string method;            // canonical
};

class SplitServer {
 public:
  explicit SplitServer(ServerOptions options);
  ~SplitServer();

  // XXH3 of config.json, the checkpoint's safetensors headers and the cut: equal on both sides
  // exactly when they hold the same base model split at the same layer.
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& device() const { return device_name_; }
  const ModelConfig& config() const { return config_; }
  // The memory budgets in bytes (max_step_memory_mb, max_client_memory_mb resolved for the device).
  uint64_t step_budget() const { return step_budget_; }
  uint64_t client_budget() const { return client_budget_; }
  // The step shapes this server accepts (max_sequence_tokens capped at the model's positions).
  StepShapeLimits step_limits() const;
  // Whether TRAIN steps may come in parts (StepInput::micro_batch): not with shared_lora, whose one
  // adapter takes the steps of every client, so one client's parts cannot hold its optimizer back.
  bool takes_micro_batches() const { return !options_.shared_lora; }

  // Registers (or resumes) a client; returns its last applied step (-1: none). Throws amaq::Error
  // (kFailedPrecondition) when the fingerprint or the cut differ, or when `run` differs from the
  // run the session holds and `start` is kContinue (the message names the differing words);
  // (kInvalidArgument) for a bad method, a run over 1024 bytes, or a method different from the one
  // the client trained with before. kFresh first discards the client's session (its LoRA, steps,
  // AQ-SGD history, an evicted copy) and writes the checkpoint without it; an empty `run` is not
  // checked, and a session without one takes the first run that joins.
  int64_t Join(const std::string& client_id, const std::string& fingerprint, int64_t cut_layer,
               const std::string& method, const std::string& run = "", RunStart start = RunStart::kContinue);
  StepResult Step(const std::string& client_id, const StepInput& input);
  // Steps of several clients, at most one each, run as one batch: the TRAIN steps share one
  // forward and backward over the server's layers (rows padded to the longest step; each client's
  // own LoRA applied to its rows, lora_row_groups.h) and every other step runs alone; each step's
  // stages are Step()'s. Each LoRA then steps once on the sum of the losses of the steps that used
  // it: with per-client LoRA, each client's update and gradient are what Step() would give (to the
  // rounding of the larger products); with shared_lora, the batch is one optimizer step over the
  // sum of its clients' mean losses. Every step of a batch sees the state from before the batch.
  // An entry gets its result, or the error that refused it: a refused step leaves no trace, and
  // the others proceed (a failure of the shared forward or backward fails the steps in it).
  struct BatchEntry {
    std::string client_id;
    const StepInput* input = nullptr;  // must stay alive during StepBatch
    StepResult result;
    std::exception_ptr error;
  };
  void StepBatch(std::vector<BatchEntry>& batch);
  // Collaborative mode (SplitFed-style): stores `tensors` as this client's latest client-side
  // adapter and returns, for each of its tensors, the element-wise mean over every client's latest
  // adapter that has a tensor of that name and size. `clients` receives how many clients that is.
  // An adapter that is not exactly the LoRA of the client's layers (names, shapes), or holds a
  // value that is not finite or beyond +-kMaxAdapterValue, is refused (kInvalidArgument) before
  // anything is stored.
  static constexpr float kMaxAdapterValue = 1e4f;
  // The bytes of the largest valid adapter upload's values (the client layers' LoRA in fp32).
  uint64_t adapter_bytes() const;
  NamedFloats AverageAdapters(const std::string& client_id, const NamedFloats& tensors, int* clients);
  // The server-side LoRA that trains with `client_id` (its own, or the shared one), as fp32 values.
  // kFailedPrecondition when the client has not joined.
  ServerAdapterInfo AdapterOf(const std::string& client_id);
  // Writes every session's server-side state atomically (no-op without a checkpoint_dir).
  void Checkpoint();
  // Evicts the sessions idle for session_ttl_seconds (Join, steps and adapter calls count as
  // activity), except those of `connected` clients: each is written atomically to its own file
  // under checkpoint_dir/sessions/, then the checkpoint is written without it; a later Join of
  // that client loads it again, with its step counter, LoRA and optimizer (its codec streams
  // start afresh, as after a restart). Returns how many were evicted (0 when the TTL is 0).
  // A failed write leaves the session in memory and throws amaq::Error.
  int EvictIdle(const std::set<std::string>& connected);
  size_t sessions_in_memory() const;
  // The bytes max_sessions_memory_mb counts, over the sessions in memory, as of the last step.
  uint64_t sessions_memory_bytes() const { return sessions_bytes_; }
  int64_t sessions_evicted() const { return sessions_evicted_; }
  std::map<std::string, ClientStats> Stats() const;
  // The curves of every client's run (run_history.h), for the live view.
  const RunHistory& history() const { return history_; }
  // Records the metric `client_id` measured after `step` training steps. kInvalidArgument for a
  // name outside 1..64 characters or a value that is not finite; kFailedPrecondition when the
  // client has not joined.
  void ReportMetric(const std::string& client_id, int64_t step, const std::string& name, double value);
  // Periodic checkpoints that failed (each is logged; the previous checkpoint stays intact).
  int64_t checkpoint_failures() const { return checkpoint_failures_; }

 private:
  struct LoraState;
  struct Session;
  using Clock = std::chrono::steady_clock;
  // The joined session of `client_id` (takes sessions_mutex_); the reference stays valid while the
  // caller holds step_mutex_ (only EvictIdle and a fresh Join remove sessions, under both).
  Session& SessionOf(const std::string& client_id);
  // Join's work on the session (the caller holds sessions_mutex_, and step_mutex_ when the
  // session was in memory already).
  int64_t JoinLocked(const std::string& client_id, const quant::Method& method, const std::string& run, RunStart start);
  // A fresh Join: drops the client's session from memory and its files (the evicted copy, the
  // AQ-SGD history); returns whether there was one. The caller holds both locks.
  bool ForgetLocked(const std::string& client_id);
  // Makes `s`'s statistics what Stats() shows (the caller holds sessions_mutex_).
  void PublishLocked(const Session& s);
  // The stages of Step (see the top of this file).
  std::optional<StepResult> AnswerRetry(Session& s, const StepInput& in);
  bool Admit(const Session& s, const StepInput& in, Clock::time_point now) const;  // true: a replay
  StepCost AdmitCost(const Session& s, const StepInput& in) const;
  // The state of `s` that max_sessions_memory_mb counts, in bytes (the caller holds step_mutex_).
  uint64_t SessionBytes(const Session& s) const;
  // Makes room for what step `in` of `s` adds to its session's state (`cost.kept_bytes`, its
  // stored reply, its AQ-SGD entries) by evicting the least recently seen sessions outside
  // `batch` and not amid a step sent in parts; throws kResourceExhausted, having moved nothing,
  // when that cannot make room. The caller holds step_mutex_.
  void KeepSessionsWithinBudget(const std::set<std::string>& batch, const Session& s, const StepInput& in,
                                const StepCost& cost);
  // Writes the session of `id` to its file under checkpoint_dir/sessions/ and drops it from
  // memory (the caller holds both locks; the checkpoint is rewritten by the caller).
  void EvictLocked(const std::string& id, const std::string& why);
  struct Received {  // what the decode stage learnt of the activation
    double average_bits = 0;
    std::map<int, double> width_shares;
  };
  torch::Tensor Decode(Session& s, const StepInput& in, Received* received);
  StepResult Evaluate(Session& s, const StepInput& in, const torch::Tensor& activation);
  // A NEXT_TOKEN step with a decoding cache: the next token of each row, [B].
  torch::Tensor NextTokensCached(Session& s, const StepInput& in, const torch::Tensor& x, const torch::Tensor& mask);
  struct Admitted;  // a TRAIN step admitted and decoded, waiting for its batch's compute
  // Forward, losses and backward of the admitted steps as one batch; each optimizer steps once
  // (replays: none); then each applied step is committed.
  void TrainBatch(std::vector<Admitted>& steps, Clock::time_point started, bool replays);
  void Commit(Session& s, const StepInput& in, const Received& received, Clock::time_point started);
  void CheckpointIfDue();
  void TryCheckpointLocked();  // CheckpointLocked, a failure logged and counted
  LoraState& LoraOf(Session& s);
  quant::CodecContext CodecContextFor(const std::string& client_id) const;
  std::unique_ptr<LoraState> NewLoraState();
  void LoadCheckpoint();
  // A session's state under "client.<id>." in an archive, and back (a session with its method set).
  void SaveSession(torch::serialize::OutputArchive& archive, Session& s);
  std::unique_ptr<Session> LoadSession(torch::serialize::InputArchive& archive, const std::string& id);
  // A session's stored answers (Session::applied) under `key`, and back.
  static void SaveAnswers(torch::serialize::OutputArchive& archive, const std::string& key, const Session& s);
  void LoadAnswers(torch::serialize::InputArchive& archive, const std::string& key, Session& s) const;
  std::string EvictedPath(const std::string& client_id) const;
  // The evicted session of `client_id`, or null; its file stays until a checkpoint holds the session.
  std::unique_ptr<Session> LoadEvicted(const std::string& client_id);
  void CheckAdapter(const NamedFloats& tensors) const;
  void CheckpointLocked();

  ServerOptions options_;
  ModelConfig config_;
  torch::Device device_{torch::kCPU};
  std::string device_name_;
  std::string fingerprint_;
  ModelPart part_{nullptr};
  std::vector<std::string> lora_names_;     // the part's LoRA tensors in TrainableParameters() order (PEFT names)
  std::vector<torch::Tensor> initial_lora_; // their seeded initial values: every LoraState's start
  std::unique_ptr<LoraState> shared_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  std::map<std::string, NamedFloats> adapters_;  // collaborative mode: each client's latest upload
  std::map<std::string, std::vector<int64_t>> client_lora_shapes_;  // what an upload must hold
  int64_t applied_since_checkpoint_ = 0;
  std::atomic<int64_t> checkpoint_failures_{0};
  std::atomic<int64_t> sessions_evicted_{0};
  std::atomic<uint64_t> sessions_bytes_{0};
  RunHistory history_;
  const Clock::time_point started_ = Clock::now();
  // Two locks, always taken in this order. step_mutex_: one step at a time; held by steps,
  // checkpoints, evictions, adapter calls and a rejoin of a session in memory: whatever reads or
  // writes a session's LoRA, codec or counters. sessions_mutex_: the sessions_ map (a first Join
  // adds to it under this lock alone, so that clients join while a step computes) and published_;
  // never held while a step computes.
  uint64_t step_budget_ = 0, client_budget_ = 0;  // bytes: the options' budgets, resolved for the device
  mutable std::mutex step_mutex_;
  mutable std::mutex sessions_mutex_;
  std::map<std::string, ClientStats> published_;  // Stats(): each session's, as of its last step or Join
};

}  // namespace amaq::server
