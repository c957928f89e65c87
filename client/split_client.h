// SplitClient: the client's half of split training.
//
//   each step: take the next batch of this client's private examples (a seeded order, so a
//   restarted client continues where the server's step counter says), run the embedding and
//   layers [0, cut) with LoRA, compress the activation at the cut with the run's method (AMAQ's
//   learned widths, a fixed-bit quantizer, AQ-SGD deltas or a float cast), send it, receive the
//   loss and the compressed gradient, and backpropagate it into the client's LoRA (and AMAQ gates).
//
// Evaluation runs through the server too (scores or next tokens come back). Every step appends a
// CSV row (bytes up and down as the transport measured them, the codec's payload and metadata,
// loss, average bits, and the metric when measured) and checkpoints are written every
// checkpoint_every steps (by default every step: the server keeps its last kAnswersKept answers,
// so a client killed at any moment resumes with both halves on one history); a reconnect after a
// broken link retries the step with backoff. A stop signal (ClientOptions::stop) ends Run after
// the step in flight, with a checkpoint, throwing Interrupted.
//
// One step stale (one_step_stale): Run begins step t + 1 (forward, encode, send) while step t is in
// flight, so the client's and the link's work overlap the server's across steps. Step t + 1's
// forward and its gradient cannot use the weights step t's update will give: they use a
// prediction of them, the client's LoRA weights plus the last update (AdamW's successive updates
// are close; SpecTrain's and PipeMare's weight prediction), kept as a copy for its backward
// (PipeDream's weight stashing), and AMAQ's gates from before step t's update. The gradient is
// applied to the weights as they are after step t. The server applies every step on its current
// weights, as always. No step is in flight across an evaluation, an adapter averaging or a
// checkpoint, nor right after a broken link.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/cut_statistics.h"
#include "client/micro_batch_choice.h"
#include "client/transport.h"
#include "common/base/env.h"
#include "common/model/batching.h"
#include "common/text/datasets.h"
#include "common/model/finetune.h"
#include "common/model/lora.h"
#include "common/model/model.h"
#include "quant/cut_codec.h"
#include "quant/method.h"

namespace amaq::client {

class RunCsv;

// The defaults here are amaq-client's (client/client_config.cc declares the keys that set them).
struct ClientOptions {
  std::string client_id = "client-0";
  std::string model_dir = "models/amaq-base";
  int64_t cut_layer = 2;
  std::string method = "fixed:3:channel:grad=4:token:symmetric";  // docs/study.md, "SmolLM2"
  std::string base_weights = "fp32";  // fp32 | bf16 | nf4 | int8 (common/model/base_weights.h); the server's must match
  bool recompute_layers = false;      // activation recomputation of the client's layers
  std::string compute_dtype = "auto";  // fp32 | bf16 | auto: the client layers' activations (LoRA stays fp32; common/model/compute_dtype.h)
  LoraConfig lora;
  double lr = 2e-3;
  double max_grad_norm = 0;      // clip the client LoRA's gradient norm per step (0: no clipping)
  int64_t steps = 200;
  int64_t batch = 16;
  // Parts each step is sent in (at most batch; 1 where the server takes whole steps only), or
  // MicroBatchChoice::kAuto: the count whose measured step times are least (client/micro_batch_choice.h).
  int64_t micro_batches = MicroBatchChoice::kAuto;
  bool one_step_stale = false;   // begin each step's forward before the previous step's update (SplitClient)
  int64_t max_tokens = 64;
  uint64_t seed = 1;
  int64_t eval_every = 0;        // 0: evaluate only at the end
  int64_t eval_examples = 200;
  int64_t eval_batch = 32;
  quant::MethodSettings method_settings;  // the method's own settings (quant/method_settings.h)
  std::string csv_path;          // empty: no CSV
  std::string predictions_path;  // empty: none; else the final evaluation's answers per example (CSV)
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 1;
  int64_t history_every = 50;    // steps between writes of the method's history (AQ-SGD's cache): a file of any age is safe
  // A restarted client further behind the server than its kept answers would train on steps the
  // server's layers already took (two histories of one model): refused unless this is set.
  bool accept_divergence = false;
  std::string adapter_out;       // empty: no PEFT export at the end (the whole fine-tune: client/adapter_export.h)
  std::string merged_out;        // empty: no merged model directory at the end (needs adapter_out)
  std::string special_tokens = "parse";  // parse | plain: special tokens in the data's text (common/text/tokenizer.h)
  int64_t sync_every = 0;        // collaborative mode: average client adapters every N steps (0: off)
  double retry_seconds = 120;    // give up on a broken link after this long
  // When the server or checkpoint_dir holds another run of this client_id (client/run_identity.h):
  // resume continues it with these settings, fresh discards it and starts at step 0 (every time
  // the client starts with it set); neither: refused.
  bool resume = false;
  bool fresh = false;
  bool progress = true;
  Env* env = Env::Default();     // checkpoints and the AQ-SGD history go through it (not owned)
  // A signal number set there (by another thread; null: none) stops Run between steps
  // (Interrupted). Must outlive the client.
  const std::atomic<int>* stop = nullptr;
};

// What Run throws when options.stop was set: training or its evaluation stopped, on signal
// `signal`, after `steps_done` steps, whose checkpoint is written (`checkpointed` false: there is
// no checkpoint_dir, or the write failed and the log says which checkpoint is kept).
struct Interrupted {
  int signal;
  int64_t steps_done;
  bool checkpointed;
};

struct StepRecord {
  int64_t step = 0;               // the step id (0-based); the CSV writes it as steps done, step + 1
  float loss = 0;
  double average_bits = 0;
  quant::ByteCount up, down;      // codec bytes of this step's activation and gradient
  uint64_t wire_up = 0, wire_down = 0;  // transport bytes so far
  int64_t parts = 1;              // the micro-batches it was sent in
  double seconds = 0;             // wall time of the step, of which:
  double client_seconds = 0;      //   client forward and backward
  double encode_seconds = 0;      //   compressing the activation, decoding the gradient
  double server_seconds = 0;      //   the server's compute
  double network_seconds = 0;     //   the rest of the exchange: transfer and queueing
  std::optional<double> metric;
  bool applied = true;            // false: a replay whose update the client's weights already hold
};

class SplitClient {
 public:
  // `data` holds this client's training examples and the validation examples it evaluates on.
  // `transport` must outlive this client.
  SplitClient(ClientOptions options, Dataset data, Transport& transport);
  ~SplitClient();

  // Joins, trains up to options.steps (resuming), evaluates, exports the adapter. Returns the
  // final metric.
  double Run();
  // Joins (or rejoins) the server and returns the step to run next.
  int64_t Join();
  // Runs training step `step` alone (Run may overlap two when one_step_stale is set). A step below
  // the first one this client has not applied yet (a replay after the server lost steps) is sent
  // for the server's sake, but the client's own weights are left as they are: each side applies
  // each step once.
  StepRecord TrainStep(int64_t step);
  // The metric on options.eval_examples validation examples, through the server; with
  // `predicted`, each example's answer there (the label chosen, or the text generated).
  double Evaluate(std::vector<std::string>* predicted = nullptr);
  // Tokens of the rows evaluations have sent to the server so far (padding included), and the
  // wall time of Run's final evaluation.
  int64_t evaluation_tokens() const { return evaluation_tokens_; }
  double last_evaluation_seconds() const { return last_evaluation_seconds_; }
  // Collaborative mode: replaces this client's LoRA weights by the average over clients. Throws
  // amaq::Error (kDataLoss), keeping its own weights, when the average lacks a tensor or holds a
  // value that is not finite.
  void SyncAdapters();
  // Writes adapter_out (and merged_out): this client's LoRA and the server's as one PEFT adapter.
  // A server that cannot give its LoRA (an older one, a broken link) leaves an adapter of this
  // client's layers alone, with a warning.
  void ExportAdapter();
  // This client's LoRA tensors (names as in PEFT), as SyncAdapters uploads them.
  NamedFloats Adapter();
  const std::vector<StepRecord>& records() const { return records_; }
  // The client layers' compute dtype as resolved for this CPU ("fp32" or "bf16").
  std::string compute_dtype() const;
  double average_bits() const;
  // AMAQ's integer width per gate now (empty for other methods).
  std::vector<uint8_t> GateBits() const;
  // Every applied training step adds its activation and the gradient it got back to `stats`
  // (null: none). `stats` must outlive this client's training.
  void ObserveCut(CutStatistics* stats) { cut_statistics_ = stats; }

 private:
  Batch BatchFor(int64_t step);
  // One part of a step (StepInput::micro_batch): rows [begin, end) and its share of the labels.
  struct Part {
    int64_t begin, end;
    float share;
  };
  // The step's rows in at most parts_.Next() parts of nearly equal rows, each with a label to learn.
  std::vector<Part> PartsOf(const Batch& b) const;
  struct InFlight;
  // Forwards step `step`'s parts and sends each as it is ready (`stash`: forward with a copy of
  // the LoRA weights plus the last update, so that the step ahead may update them before this
  // one's backward). A broken link stops the sending; Finish sends the rest.
  InFlight Begin(int64_t step, bool stash);
  // Part p of f forwarded and encoded, appended to f's parts sent.
  void Prepare(InFlight& f, size_t p);
  // Receives f's answers in order (sending again what a broken link lost), backpropagates them,
  // steps the optimizer and records the step. Begins are finished in the order they began.
  StepRecord Finish(InFlight& f);
  // Gives auto micro-batches' trials f's step time (f finished on the connection it began on).
  void TimeParts(const InFlight& f);
  // Whether Run begins the step after f's before finishing f.
  bool BeginsNextDuring(const InFlight& f) const;
  // The seeded example order, positioned at the batch of step `order_step_` (rebuilt only when a
  // resumed or rejoined client goes back to an earlier step).
  std::unique_ptr<ExampleOrder> order_;
  int64_t order_step_ = 0;
  // Calls `attempt` until it succeeds, with exponential backoff: a broken link (amaq::Error
  // kUnavailable) for up to retry_seconds, a server asking to slow down (kResourceExhausted: its
  // rate limit, or a size limit that retries cannot cure) five times; other errors pass through.
  template <typename F>
  auto RetryTransient(const std::string& what, F attempt) -> decltype(attempt());
  StepResult Exchange(const StepInput& input);
  // Sends the metric after `steps_done` training steps to the server's live view; a refusal is
  // logged, not thrown.
  void ReportMetric(int64_t steps_done, double metric);
  void WriteCsv(const StepRecord& r);
  // Logs a warning with how many training examples exceed max_tokens (MakeBatch cuts their
  // prompts' beginnings), none when every one fits.
  void WarnOfCutExamples() const;
  // predictions_path: each evaluated example's index, expected and predicted answer, and whether
  // they agree (written whole, atomically).
  void WritePredictions(const std::vector<std::string>& predicted);
  // Writes the checkpoint of `next_step` steps done (with `history`, the method's history too).
  void SaveCheckpoint(int64_t next_step, bool history);
  // A failed checkpoint is logged, naming the file and the last checkpoint written; training goes
  // on (that one is intact). Returns whether it was written.
  bool TrySaveCheckpoint(int64_t next_step, bool history);
  int64_t LoadCheckpoint();
  // fresh: removes the checkpoint of the run the server has just discarded, so that a stop before
  // this run's first checkpoint does not leave the old run to be continued.
  void RemoveOldCheckpoint();
  // The step both halves continue at after a Join that found the server at `server_next`
  // (docs/reliability.md, "Crashes"). Throws amaq::Error (kFailedPrecondition) when the server
  // applied steps beyond this client's checkpoint whose answers it no longer keeps, unless
  // accept_divergence.
  int64_t ResumeStep(int64_t server_next) const;
  bool StopRequested() const { return options_.stop && options_.stop->load() != 0; }
  // Between steps (none in flight): checkpoints the steps done, unless written already, and
  // throws Interrupted.
  [[noreturn]] void StopNow();

  ClientOptions options_;
  Dataset data_;
  Transport& transport_;
  std::unique_ptr<quant::Method> method_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ExampleEncoder> encoder_;
  ModelPart part_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<quant::ClientCodec> codec_;  // the method's half at this end of the cut
  std::string fingerprint_;
  std::string run_;          // RunIdentity
  int64_t checkpointed_ = -1;  // the steps done of the last checkpoint written (-1: none this run)
  RunStart run_start_;       // the first Join's (options' resume or fresh); kContinue after it
  std::vector<StepRecord> records_;
  std::unique_ptr<RunCsv> csv_;  // null: no csv
  CutStatistics* cut_statistics_ = nullptr;
  int64_t client_next_ = 0;  // the first step whose update the client's weights do not hold
  // One step stale: what the last optimizer step added to each LoRA weight (empty before the
  // first; kept in checkpoints, so a resumed run predicts as the uninterrupted one).
  std::vector<torch::Tensor> last_update_;
  int64_t evaluation_tokens_ = 0;
  double last_evaluation_seconds_ = 0;
  MicroBatchChoice parts_{MicroBatchChoice::kAuto, 1, false};  // options_.micro_batches for this transport
  int64_t joins_ = 0;        // joins so far: a step sent on an earlier join's stream was lost with it
  std::chrono::steady_clock::time_point finished_at_;  // when the last step finished
};

}  // namespace amaq::client
