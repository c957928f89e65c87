// SplitServer: the server's half of split training, independent of the network layer.
//
// It holds layers [cut, L), the final norm and the head of a Hugging Face model, with LoRA, on the
// configured device. Each joined client has a session, which a SessionStore (session_store.h)
// holds, checkpoints and evicts: its quantization method and the method's server codec
// (quant/cut_codec.h: both codec streams, the AQ-SGD cache), its step counter and the replies of
// its last steps; and either its own server LoRA with its own optimizer or a share of one LoRA
// common to all clients. A step runs in stages:
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

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
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
#include "server/run_history.h"
#include "server/server_options.h"
#include "server/session_store.h"
#include "server/step_cost.h"

namespace amaq::server {

class SplitServer {
 public:
  explicit SplitServer(ServerOptions options);
  ~SplitServer();

  // XXH3 of config.json, the checkpoint's safetensors headers and the cut: equal on both sides
  // exactly when they hold the same base model split at the same layer.
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& device() const { return device_name_; }
  const ModelConfig& config() const { return config_; }
  // The server layers' compute dtype as resolved for the device ("fp32" or "bf16").
  std::string compute_dtype() const;
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
  // Calls `f` under the step lock (no step runs meanwhile) with the shared LoRA's values, detached
  // (changes in place change the LoRA; no optimizer state is passed). Does nothing and returns
  // false without shared_lora. What `f` throws propagates, the lock released.
  bool WithSharedLora(const std::function<void(const std::vector<torch::Tensor>&)>& f);
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
  size_t sessions_in_memory() const { return store_->in_memory(); }
  // The bytes max_sessions_memory_mb counts, over the sessions in memory, as of the last step.
  uint64_t sessions_memory_bytes() const { return store_->memory_bytes(); }
  int64_t sessions_evicted() const { return store_->evicted(); }
  std::map<std::string, ClientStats> Stats() const { return store_->Stats(); }
  // The curves of every client's run (run_history.h), for the live view.
  const RunHistory& history() const { return history_; }
  // Records the metric `client_id` measured after `step` training steps. kInvalidArgument for a
  // name outside 1..64 characters or a value that is not finite; kFailedPrecondition when the
  // client has not joined.
  void ReportMetric(const std::string& client_id, int64_t step, const std::string& name, double value);
  // Periodic checkpoints that failed (each is logged; the previous checkpoint stays intact).
  int64_t checkpoint_failures() const { return store_->checkpoint_failures(); }

 private:
  using Clock = Env::Clock;
  // The stages of Step (see the top of this file).
  std::optional<StepResult> AnswerRetry(Session& s, const StepInput& in);
  bool Admit(const Session& s, const StepInput& in, Clock::time_point now) const;  // true: a replay
  StepCost AdmitCost(const Session& s, const StepInput& in) const;
  // What step `in` of `s` adds to its session's state: `cost.kept_bytes`, its stored reply, its
  // AQ-SGD entries (SessionStore::KeepWithinBudget makes room for it).
  uint64_t AddedBytes(const Session& s, const StepInput& in, const StepCost& cost) const;
  struct Received {  // what the decode stage learnt of the activation
    double average_bits = 0;
    std::map<int, double> width_shares;
  };
  torch::Tensor Decode(Session& s, const StepInput& in, Received* received);
  StepResult Evaluate(Session& s, const StepInput& in, const torch::Tensor& activation);
  // A NEXT_TOKEN step with a decoding cache: the next token of each row, [B].
  torch::Tensor NextTokensCached(Session& s, const StepInput& in, const torch::Tensor& x, const torch::Tensor& mask);
  struct Admitted;  // a TRAIN step admitted and decoded, waiting for its batch's compute
  struct Forward;   // the batch's rows through the server's layers, waiting for its losses
  // Forward, losses and backward of the admitted steps as one batch; each optimizer steps once
  // (replays: none); then each applied step is committed. Compute in RunForward and Backward,
  // bookkeeping in StartSteps, Answer and Commit.
  void TrainBatch(std::vector<Admitted>& steps, Clock::time_point started, bool replays);
  Forward RunForward(const std::vector<Admitted>& steps);
  // Clears the gradients of the steps that start here (first parts, replays).
  void StartSteps(const std::vector<Admitted>& steps, bool replays);
  // Each step's loss and its backward into the layers' output; returns the LoRAs to step, each
  // once, and marks the steps whose loss is finite (the others get their error).
  std::vector<LoraState*> Losses(std::vector<Admitted>& steps, Forward& f, bool replays, std::vector<bool>* finite);
  // Each finite step's gradient at the cut, encoded into its result; returns them raw (fp32, CPU).
  std::vector<torch::Tensor> Answer(std::vector<Admitted>& steps, Forward& f, const std::vector<bool>& finite,
                                    Clock::time_point started);
  void Commit(Session& s, const StepInput& in, const Received& received, Clock::time_point started);
  void CheckAdapter(const NamedFloats& tensors) const;

  ServerOptions options_;
  ModelConfig config_;
  torch::Device device_{torch::kCPU};
  std::string device_name_;
  std::string fingerprint_;
  ModelPart part_{nullptr};
  std::vector<std::string> lora_names_;     // the part's LoRA tensors in TrainableParameters() order (PEFT names)
  std::map<std::string, std::vector<int64_t>> client_lora_shapes_;  // what an adapter upload must hold
  uint64_t step_budget_ = 0, client_budget_ = 0;  // bytes: the options' budgets, resolved for the device
  std::unique_ptr<SessionStore> store_;
  RunHistory history_;
  const Clock::time_point started_ = Clock::now();
  // One step at a time: held by steps, checkpoints, evictions, adapter calls and a rejoin of a
  // session in memory: whatever reads or writes a session's LoRA, codec or counters. Taken before
  // the store's own lock (session_store.h).
  mutable std::mutex step_mutex_;
};

}  // namespace amaq::server
