#include "client/split_client.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <numeric>
#include <sstream>
#include <thread>

#include "client/adapter_export.h"
#include "client/run_csv.h"
#include "client/run_identity.h"
#include "common/base/atomic_file.h"
#include "common/model/archive_check.h"
#include "common/model/checkpoint.h"
#include "common/model/compute_dtype.h"
#include "common/base/error.h"
#include "common/model/decoders.h"
#include "common/model/evaluate.h"
#include "common/model/finetune.h"
#include "common/base/progress.h"
#include "common/model/lora_row_groups.h"

namespace amaq::client {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A broken link, or a server asking to slow down: what was in flight is sent again.
bool SendAgainAfter(const Error& e) {
  return e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kResourceExhausted;
}

std::vector<int32_t> Flat(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kInt).contiguous();
  return std::vector<int32_t>(c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel());
}

}  // namespace

template <typename F>
auto SplitClient::RetryTransient(const std::string& what, F attempt) -> decltype(attempt()) {
  constexpr int kSlowDownRetries = 5;  // 0.5 + 1 + 2 + 4 + 8 s: above any rate limit of >= 0.1 steps/s
  const auto started = Clock::now();
  double backoff = 0.5;
  int slow_downs = 0;
  while (true) {
    try {
      return attempt();
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(Clock::now() - started).count();
      const bool transient = (e.code() == ErrorCode::kUnavailable && waited <= options_.retry_seconds) ||
                             (e.code() == ErrorCode::kResourceExhausted && ++slow_downs <= kSlowDownRetries);
      if (!transient) throw;
      spdlog::warn("{}: {} (retrying in {:.1f} s)", what, e.what(), backoff);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 10.0);
    }
  }
}

SplitClient::SplitClient(ClientOptions options, Dataset data, Transport& transport)
    : options_(std::move(options)), data_(std::move(data)), transport_(transport),
      method_(quant::Method::Parse(options_.method)) {
  config_ = ModelConfig::Load(options_.model_dir + "/config.json");
  Require(options_.cut_layer >= 0 && options_.cut_layer <= config_.num_hidden_layers, ErrorCode::kInvalidArgument,
          "cut_layer " + std::to_string(options_.cut_layer) + " lies outside the model's " +
              std::to_string(config_.num_hidden_layers) + " layers: choose 0.." + std::to_string(config_.num_hidden_layers));
  Require(!data_.train.empty(), ErrorCode::kInvalidArgument, "client " + options_.client_id + " has no training examples");
  Require(!(options_.one_step_stale && options_.recompute_layers), ErrorCode::kInvalidArgument,
          "one_step_stale and recompute_layers are both set: a stale step's backward needs the activations of its own "
          "forward; turn one of them off");
  Require(options_.merged_out.empty() || !options_.adapter_out.empty(), ErrorCode::kInvalidArgument,
          "merged_out is set but adapter_out is not: set adapter_out too (the merged model is built from the adapter)");
  parts_ = MicroBatchChoice(options_.micro_batches, options_.batch, transport_.over_network());
  tokenizer_ = Tokenizer::Load(options_.model_dir, ParseSpecialTokens(options_.special_tokens));
  encoder_ = std::make_unique<ExampleEncoder>(*tokenizer_, config_.bos_token_id, config_.eos_token_id, options_.max_tokens);
  WarnOfCutExamples();
  torch::manual_seed(options_.seed);
  const BaseWeights base_weights = ParseBaseWeights(options_.base_weights);
  part_ = ModelPart(config_, PartSpec::Client(options_.cut_layer), base_weights);
  LoadPartWeights(part_, options_.model_dir);
  part_->AddLora(options_.lora, options_.seed);
  part_->set_recompute_layers(options_.recompute_layers);
  part_->set_compute_dtype(ParseComputeDtype(options_.compute_dtype, torch::kCPU));
  if (options_.compute_dtype == "auto") {
    spdlog::info("client {}: compute_dtype auto: {} on this CPU ({} bf16 arithmetic)", options_.client_id, compute_dtype(),
                 compute_dtype() == "bf16" ? "it has" : "it lacks");
  }
  const std::vector<torch::Tensor> trainable = part_->TrainableParameters();
  if (!trainable.empty()) {
    optimizer_ = std::make_unique<torch::optim::AdamW>(trainable, torch::optim::AdamWOptions(options_.lr).weight_decay(0.0));
  }
  quant::CodecContext context;
  context.channels = config_.hidden_size;
  context.steps = options_.steps;
  context.settings = options_.method_settings;
  context.env = options_.env;
  if (!options_.checkpoint_dir.empty()) context.history_stem = options_.checkpoint_dir + "/" + options_.client_id;
  codec_ = method_->MakeClientCodec(context);
  fingerprint_ = ModelFingerprint(options_.model_dir, options_.cut_layer, base_weights);
  Require(!(options_.resume && options_.fresh), ErrorCode::kInvalidArgument,
          "resume and fresh are both set: resume continues the stored run, fresh discards it; set one");
  run_ = RunIdentity(options_, fingerprint_, method_->ToString(), data_);
  run_start_ = options_.fresh ? RunStart::kFresh : options_.resume ? RunStart::kResume : RunStart::kContinue;
  if (!options_.csv_path.empty()) csv_ = std::make_unique<RunCsv>(options_.csv_path);
}

SplitClient::~SplitClient() = default;

std::string SplitClient::compute_dtype() const { return ComputeDtypeName(part_->compute_dtype()); }

void SplitClient::WarnOfCutExamples() const {
  size_t cut = 0, longest = 0;
  for (const Example& e : data_.train) {
    // A token covers at least one byte, the space between prompt and completion included, and a
    // tokenizer may add one before the text: shorter examples need no tokenizing to be known whole.
    if (e.prompt.size() + e.completion.size() + 5 <= static_cast<size_t>(options_.max_tokens)) continue;
    const ExampleEncoder::Pair pair = encoder_->Encode(e.prompt, e.completion);
    const size_t tokens = pair.prompt.size() + pair.completion.size() + 2;  // BOS and EOS around them
    if (tokens > static_cast<size_t>(options_.max_tokens)) {
      ++cut;
      longest = std::max(longest, tokens);
    }
  }
  if (cut == 0) return;
  spdlog::warn("client {}: {} of {} training examples are longer than max_tokens ({}; the longest has {} tokens with BOS "
               "and EOS): each trains on its last {} tokens, the beginning of its prompt cut; raise max_tokens to keep "
               "them whole", options_.client_id, cut, data_.train.size(), options_.max_tokens, longest, options_.max_tokens);
}

int64_t SplitClient::Join() {
  const int64_t last =
      transport_.Join(JoinInfo{options_.client_id, fingerprint_, options_.cut_layer, method_->ToString(), run_, run_start_});
  run_start_ = RunStart::kContinue;  // the server holds this run now: a rejoin continues it
  codec_->Reset();
  if (++joins_ > 1) parts_.Remeasure();  // the new connection may take another path
  if (options_.micro_batches != 1 && !transport_.server_takes_micro_batches()) {
    spdlog::info("client {}: the server takes whole steps only (it trains one shared LoRA): steps go whole, not in parts",
                 options_.client_id);
  }
  return last + 1;
}

Batch SplitClient::BatchFor(int64_t step) {
  // The order is a pure function of the seed, so a restarted client finds the same batch for a step.
  if (!order_ || step < order_step_) {
    order_ = std::make_unique<ExampleOrder>(data_.train.size(), options_.seed);
    order_step_ = 0;
  }
  std::vector<size_t> picked;
  for (; order_step_ <= step; ++order_step_) picked = order_->Next(static_cast<size_t>(options_.batch));
  std::vector<const Example*> examples;
  std::vector<uint64_t> ids;
  for (size_t i : picked) {
    examples.push_back(&data_.train[i]);
    ids.push_back(i);
  }
  return encoder_->MakeBatch(examples, ids, true, codec_->fixed_tokens() ? options_.max_tokens : 0);
}

StepResult SplitClient::Exchange(const StepInput& input) {
  StepInput attempt = input;
  bool retry = false;
  return RetryTransient("step " + std::to_string(input.step_id), [&] {
    if (retry) {
      Join();  // fresh codec streams on both sides: re-encode what referred to the old ones
      if (input.kind == StepKind::kTrain) attempt.activation = codec_->EncodeTrainingAgain(input.step_id, input.micro_batch);
    }
    retry = true;
    return transport_.Step(attempt);
  });
}

std::vector<SplitClient::Part> SplitClient::PartsOf(const Batch& b) const {
  // Labels the loss counts per row: those from position 1 on (it predicts token t from t - 1).
  const torch::Tensor labelled = b.labels.slice(1, 1).ne(-100).sum(1).to(torch::kCPU, torch::kLong).contiguous();
  const int64_t rows = labelled.size(0);
  const int64_t* per_row = labelled.data_ptr<int64_t>();
  const int64_t total = std::accumulate(per_row, per_row + rows, int64_t{0});
  const int64_t most = transport_.server_takes_micro_batches() ? parts_.Next() : 1;
  for (int64_t n = std::min(most, rows); n > 1; --n) {
    std::vector<Part> parts;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t begin = rows * k / n, end = rows * (k + 1) / n;
      const int64_t labels = std::accumulate(per_row + begin, per_row + end, int64_t{0});
      if (labels == 0) break;  // a part without a label has no loss: try fewer parts
      parts.push_back({begin, end, static_cast<float>(static_cast<double>(labels) / static_cast<double>(total))});
    }
    if (static_cast<int64_t>(parts.size()) == n) return parts;
  }
  return {{0, rows, 1.0f}};
}

// A training step sent and not yet answered, with what its answers need.
struct SplitClient::InFlight {
  struct Sent {
    torch::Tensor x, upstream;
    StepInput input;
  };
  Clock::time_point started;
  Batch batch;
  std::vector<Part> parts;
  std::vector<Sent> sent;  // the parts forwarded and encoded, in order
  // The LoRA weights the forward used in place of the client's (a prediction, for a step begun
  // before the one ahead of it applied its update); empty: the forward used the weights themselves.
  std::vector<torch::Tensor> stashed;
  int64_t join = 0;                  // the join whose stream its parts went out on
  int64_t parts_asked = 1;           // parts_.Next() when it began
  std::optional<std::string> unsent;  // why its parts stopped going out (a broken link)
  double bits_times_rows = 0;
  StepRecord r;
};

void SplitClient::Prepare(InFlight& f, size_t p) {
  const auto mark = Clock::now();
  const Batch& b = f.batch;
  const Part& part = f.parts[p];
  const auto slice = [&](const torch::Tensor& t) { return t.slice(0, part.begin, part.end); };
  const torch::Tensor ids = slice(b.ids), mask = slice(b.mask), labels = slice(b.labels);
  InFlight::Sent s;
  {
    std::optional<LoraRowGroups> stashed;  // the forward's LoRA: the stash, while this lives
    const std::vector<const std::vector<torch::Tensor>*> adapters{&f.stashed};
    if (!f.stashed.empty()) stashed.emplace(part_, std::vector<int64_t>{0, ids.size(0)}, adapters);
    s.x = part_(ids, mask).to(torch::kFloat).reshape({ids.size(0) * ids.size(1), config_.hidden_size});
  }
  f.r.client_seconds += SecondsSince(mark);
  StepInput& input = s.input;
  input.step_id = f.r.step;
  input.kind = StepKind::kTrain;
  input.sample_ids.assign(b.sample_ids.begin() + part.begin, b.sample_ids.begin() + part.end);
  input.batch = ids.size(0);
  input.tokens = ids.size(1);
  input.mask = Flat(mask);
  input.labels = Flat(labels);
  input.micro_batch = static_cast<int32_t>(p);
  input.micro_batches = static_cast<int32_t>(f.parts.size());
  input.loss_scale = part.share;
  const auto encoding = Clock::now();
  quant::Encoded encoded = codec_->EncodeTraining(
      s.x, quant::SampleRows{input.batch, input.tokens, input.sample_ids, input.micro_batch, input.step_id}, &s.upstream);
  f.r.up += encoded.count;
  f.bits_times_rows += encoded.average_bits * static_cast<double>(s.x.size(0));
  input.activation = std::move(encoded.bytes);
  f.r.encode_seconds += SecondsSince(encoding);
  f.sent.push_back(std::move(s));
}

SplitClient::InFlight SplitClient::Begin(int64_t step, bool stash) {
  InFlight f;
  f.started = Clock::now();
  part_->train();
  f.batch = BatchFor(step);
  f.parts_asked = parts_.Next();
  f.parts = PartsOf(f.batch);
  f.join = joins_;
  f.r.step = step;
  f.r.applied = step >= client_next_;
  if (stash) {
    torch::NoGradGuard no_grad;
    // The weights as the step ahead's update will leave them, predicted: plus the last update.
    const std::vector<torch::Tensor> weights = part_->TrainableParameters();
    for (size_t i = 0; i < weights.size(); ++i) {
      torch::Tensor w = weights[i].detach().clone();
      if (i < last_update_.size()) w += last_update_[i];
      f.stashed.push_back(w.requires_grad_(true));
    }
  } else if (f.r.applied && optimizer_) {
    optimizer_->zero_grad();
  }
  // The parts go out as they are ready, without waiting for answers (the transport overlaps them
  // with this side's compute and the server's); the answers come back in order (Finish).
  try {
    for (size_t p = 0; p < f.parts.size(); ++p) {
      Prepare(f, p);
      transport_.Send(f.sent.back().input);
    }
  } catch (const Error& e) {
    if (!SendAgainAfter(e)) throw;
    f.unsent = e.what();  // Finish sends the rest
  }
  return f;
}

StepRecord SplitClient::Finish(InFlight& f) {
  StepRecord& r = f.r;
  // A part's answer: its gradient decoded and backpropagated (added to the step's).
  const auto apply = [&](const InFlight::Sent& s, const StepResult& result) {
    r.server_seconds += result.server_seconds;
    r.loss += result.loss;
    auto mark = Clock::now();
    quant::ByteCount down;
    const torch::Tensor gradient = codec_->DecodeGradient(result.gradient, s.x.size(0), config_.hidden_size, &down);
    r.down += down;  // every part's
    r.encode_seconds += SecondsSince(mark);
    mark = Clock::now();
    if (r.applied && cut_statistics_) cut_statistics_->Add(s.x, gradient);
    if (r.applied && s.upstream.requires_grad()) s.upstream.backward(gradient.to(s.upstream.scalar_type()));
    r.client_seconds += SecondsSince(mark);
  };
  // A broken link loses the parts in flight: the client rejoins (fresh codec streams) and sends
  // each remaining part again, one at a time, with Exchange's retries and backoff. Parts sent
  // before an earlier rejoin were lost with their stream.
  size_t answered = 0;
  std::optional<std::string> lost = f.unsent;
  if (f.join != joins_) lost = "the link broke while it was in flight";
  if (!lost) {
    try {
      for (; answered < f.parts.size(); ++answered) apply(f.sent[answered], transport_.Receive());
    } catch (const Error& e) {
      if (!SendAgainAfter(e)) throw;
      lost = e.what();  // the parts not answered are sent again
    }
  }
  if (lost) {
    spdlog::warn("client {}: step {}: {}; sending its {} unanswered part(s) again", options_.client_id, r.step, *lost,
                 f.parts.size() - answered);
    if (f.join == joins_) RetryTransient("client " + options_.client_id, [this] { return Join(); });
    for (; answered < f.parts.size(); ++answered) {
      if (answered < f.sent.size()) {
        f.sent[answered].input.activation = codec_->EncodeTrainingAgain(r.step, static_cast<int>(answered));
      } else {
        Prepare(f, answered);
      }
      apply(f.sent[answered], Exchange(f.sent[answered].input));
    }
  }
  r.average_bits = f.bits_times_rows / static_cast<double>(f.batch.ids.size(0) * f.batch.ids.size(1));
  const auto mark = Clock::now();
  if (r.applied) {
    codec_->Step();
    if (optimizer_) {
      const std::vector<torch::Tensor> weights = part_->TrainableParameters();
      for (size_t i = 0; i < f.stashed.size(); ++i) {  // the stash's gradient is the step's
        const torch::Tensor& g = f.stashed[i].grad();
        weights[i].mutable_grad() = g.defined() ? g : torch::zeros_like(weights[i]);
      }
      if (options_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(weights, options_.max_grad_norm);
      std::vector<torch::Tensor> before;  // one step stale: the update predicts the next one
      if (options_.one_step_stale) {
        for (const torch::Tensor& w : weights) before.push_back(w.detach().clone());
      }
      optimizer_->step();
      last_update_.clear();
      for (size_t i = 0; i < before.size(); ++i) last_update_.push_back(weights[i].detach() - before[i]);
    }
    client_next_ = r.step + 1;
  }
  r.client_seconds += SecondsSince(mark);
  // A step begun while the one before it was in flight takes the time since that one finished.
  const auto now = Clock::now();
  r.seconds = std::chrono::duration<double>(now - std::max(f.started, finished_at_)).count();
  finished_at_ = now;
  // The parts overlap: the network's share is what the step's time leaves to the rest (0 when it
  // hid entirely behind compute).
  r.network_seconds = std::max(0.0, r.seconds - r.client_seconds - r.encode_seconds - r.server_seconds);
  r.parts = static_cast<int64_t>(f.parts.size());
  if (!lost) TimeParts(f);
  r.wire_up = transport_.bytes_up();
  r.wire_down = transport_.bytes_down();
  records_.push_back(r);
  WriteCsv(r);
  return r;
}

void SplitClient::TimeParts(const InFlight& f) {
  // Replays (steps the server answers from its store) do not measure the link.
  if (!f.r.applied || !transport_.server_takes_micro_batches() || parts_.chosen()) return;
  parts_.Took(f.parts_asked, f.r.seconds);
  if (parts_.chosen()) spdlog::info("client {}: micro_batches auto: {}", options_.client_id, parts_.Describe());
}

StepRecord SplitClient::TrainStep(int64_t step) {
  InFlight f = Begin(step, false);
  return Finish(f);
}

bool SplitClient::BeginsNextDuring(const InFlight& f) const {
  const int64_t next = f.r.step + 1;
  const auto every = [next](int64_t n) { return n > 0 && next % n == 0; };
  // Evaluations, adapter averaging and checkpoints happen between steps, with none in flight.
  return options_.one_step_stale && f.r.applied && f.join == joins_ && !f.unsent && next < options_.steps &&
         !every(options_.eval_every) && !every(options_.sync_every) &&
         (options_.checkpoint_dir.empty() || !every(options_.checkpoint_every)) && !StopRequested();
}

double SplitClient::Evaluate(std::vector<std::string>* predicted) {
  torch::NoGradGuard no_grad;
  part_->eval();
  // The client part's output [B, T, H] to the server, as an evaluation step of `kind` (SCORE steps
  // carry `targets` and no labels).
  const auto send = [&](const torch::Tensor& hidden, const torch::Tensor& mask, StepKind kind, DecodeCache cache,
                        const ScoreTargets& targets = {}) {
    if (StopRequested()) StopNow();  // an evaluation is long: it stops between its requests
    const int64_t rows = hidden.size(0) * hidden.size(1);
    StepInput input;
    input.kind = kind;
    input.cache = cache;
    input.batch = hidden.size(0);
    input.tokens = hidden.size(1);
    input.mask = Flat(mask);
    if (kind != StepKind::kScore) input.labels.assign(static_cast<size_t>(rows), -100);
    input.targets = targets;
    input.activation = codec_->EncodeEvaluation(hidden.to(torch::kFloat).reshape({rows, config_.hidden_size}));
    evaluation_tokens_ += rows;
    return Exchange(input);
  };
  const std::vector<Example> examples(data_.validation.begin(),
                                      data_.validation.begin() + std::min<int64_t>(options_.eval_examples, data_.validation.size()));
  if (data_.is_classification()) {
    Require(transport_.server_scores_targets(), ErrorCode::kFailedPrecondition,
            "the server is an older amaq-server that scores labels, not targets (docs/protocol.md): update it to evaluate");
    const CandidateScorer score = [&](const CandidateBatch& b) {
      const StepResult r = send(part_(b.ids, b.mask), b.mask, StepKind::kScore, DecodeCache::kNone, b.targets);
      Require(static_cast<int64_t>(r.scores.size()) == b.ids.size(0) * b.targets.count, ErrorCode::kDataLoss,
              "the server returned " + std::to_string(r.scores.size()) + " scores for " + std::to_string(b.ids.size(0)) +
                  " rows of " + std::to_string(b.targets.count) + " candidates: the server and this client disagree; update both");
      return torch::tensor(r.scores).view({b.ids.size(0), b.targets.count});
    };
    return ClassificationAccuracy(score, *encoder_, data_, examples, options_.eval_batch, config_.max_position_embeddings,
                                  predicted);
  }
  if (transport_.server_decodes_with_cache()) {
    // Both sides keep their keys and values: a new token crosses the cut as one row per sequence.
    CachedDecoder decoder(part_, [&](const torch::Tensor& hidden, const torch::Tensor& mask, bool start) {
      const StepResult r = send(hidden, mask, StepKind::kNextToken, start ? DecodeCache::kStart : DecodeCache::kExtend);
      return torch::tensor(r.next_tokens, torch::kLong);
    });
    return ExactMatch(decoder, *encoder_, examples, 12, options_.eval_batch, predicted);
  }
  RecomputingDecoder decoder([&](const torch::Tensor& ids, const torch::Tensor& mask) {  // an older server
    return torch::tensor(send(part_(ids, mask), mask, StepKind::kNextToken, DecodeCache::kNone).next_tokens, torch::kLong);
  });
  return ExactMatch(decoder, *encoder_, examples, 12, options_.eval_batch, predicted);
}

NamedFloats SplitClient::Adapter() {
  NamedFloats mine;
  for (auto& [name, t] : part_->LoraParameters()) {
    const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    mine[name] = NamedFloat{c.sizes().vec(), std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel())};
  }
  return mine;
}

void SplitClient::SyncAdapters() {
  const NamedFloats average = transport_.SyncAdapters(Adapter());
  torch::NoGradGuard no_grad;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> averaged;
  for (auto& [name, t] : part_->LoraParameters()) {
    const auto it = average.find(name);
    Require(it != average.end() && static_cast<int64_t>(it->second.values.size()) == t.numel(), ErrorCode::kDataLoss,
            "the averaged adapter lacks " + name + ": clients must use the same LoRA settings");
    const torch::Tensor values = torch::tensor(it->second.values).view(t.sizes());
    Require(torch::isfinite(values).all().item<bool>(), ErrorCode::kDataLoss,
            "the averaged adapter's " + name + " holds values that are not finite: kept this client's own; "
            "tell the server's operator (another client's upload is broken)");
    averaged.emplace_back(t, values);
  }
  for (auto& [target, values] : averaged) target.copy_(values);  // all or nothing
}

std::vector<uint8_t> SplitClient::GateBits() const { return codec_->GateBits(); }

double SplitClient::average_bits() const { return records_.empty() ? 0 : records_.back().average_bits; }

void SplitClient::WriteCsv(const StepRecord& r) {
  if (csv_) csv_->Write(options_.client_id, method_->ToString(), transport_.server(), r);
}

namespace {

// A CSV field: quoted, with quotes doubled (answers may hold commas, quotes and newlines).
std::string CsvField(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

void SplitClient::WritePredictions(const std::vector<std::string>& predicted) {
  std::string text = "example,expected,predicted,correct\n";
  for (size_t i = 0; i < predicted.size(); ++i) {
    const std::string& expected = data_.validation[i].completion;
    text += std::to_string(i) + "," + CsvField(expected) + "," + CsvField(predicted[i]) + "," + (expected == predicted[i] ? "1" : "0") + "\n";
  }
  WriteFileAtomically(options_.predictions_path, text, options_.env);
}

bool SplitClient::TrySaveCheckpoint(int64_t next_step, bool history) {
  try {
    SaveCheckpoint(next_step, history);
    return true;
  } catch (const Error& e) {
    const std::string kept = checkpointed_ < 0 ? "no checkpoint of this run is written yet"
                                               : "the checkpoint of step " + std::to_string(checkpointed_) + " is kept";
    spdlog::error("client {}: the checkpoint of step {} in {} failed ({}); {}, and training goes on", options_.client_id,
                  next_step, options_.checkpoint_dir, e.what(), kept);
    return false;
  }
}

void SplitClient::SaveCheckpoint(int64_t next_step, bool history) {
  if (options_.checkpoint_dir.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  torch::serialize::OutputArchive archive;
  archive.write("run", c10::IValue(run_));
  archive.write("next_step", torch::tensor(next_step));
  for (auto& [name, t] : part_->LoraParameters()) archive.write("lora." + name, t);
  if (optimizer_) {
    torch::serialize::OutputArchive opt;
    optimizer_->save(opt);
    archive.write("optimizer", opt);
  }
  for (size_t i = 0; i < last_update_.size(); ++i) archive.write("last_update." + std::to_string(i), last_update_[i]);
  codec_->Save(archive);
  if (history) codec_->SaveHistory();  // a file of its own, of any age: safe with the checkpoint before or after it
  std::ostringstream out;
  archive.save_to(out);
  const std::string bytes = out.str();
  WriteFileAtomically(options_.checkpoint_dir + "/" + options_.client_id + ".pt", bytes, options_.env);
  checkpointed_ = next_step;
  spdlog::debug("client {}: checkpoint of step {} written, {} bytes{}, in {:.1f} ms", options_.client_id, next_step,
                bytes.size(), history ? " and the method's history" : "",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
}

int64_t SplitClient::LoadCheckpoint() {
  const std::string path = options_.checkpoint_dir + "/" + options_.client_id + ".pt";
  if (options_.checkpoint_dir.empty() || !options_.env->FileExists(path)) return 0;
  torch::serialize::InputArchive archive;
  ReadArchive(*options_.env, path, "client checkpoint", archive);
  c10::IValue stored;
  const std::string run = archive.try_read("run", stored) ? stored.toStringRef() : "";  // absent before runs
  if (options_.fresh) {
    spdlog::info("client {}: fresh: {} is not restored, and is removed once the server has forgotten the run",
                 options_.client_id, path);
    return 0;
  }
  if (!run.empty() && run != run_ && !options_.resume) {
    throw Error(ErrorCode::kFailedPrecondition, path + " holds another run of client " + options_.client_id + ": " +
                                                    RunMismatch(run, run_));
  }
  RequireFiniteArchive(archive, path);
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : part_->LoraParameters()) {
    torch::Tensor saved;
    archive.read("lora." + name, saved);
    t.copy_(saved);
  }
  if (optimizer_) {
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    optimizer_->load(opt);
  }
  last_update_.clear();  // one step stale's prediction (absent from checkpoints without one)
  while (true) {
    torch::Tensor update;  // a fresh one each time: try_read reads into a defined tensor in place
    if (!archive.try_read("last_update." + std::to_string(last_update_.size()), update)) break;
    last_update_.push_back(update);
  }
  torch::Tensor next;
  archive.read("next_step", next);
  codec_->Load(archive, next.item<int64_t>());
  try {
    codec_->LoadHistory();
  } catch (const Error& e) {  // it only saves bytes: the samples go in full again
    spdlog::warn("client {}: {}; continuing without it", options_.client_id, e.what());
  }
  spdlog::info("client {}: restored its checkpoint of step {}", options_.client_id, next.item<int64_t>());
  checkpointed_ = next.item<int64_t>();
  return checkpointed_;
}

void SplitClient::RemoveOldCheckpoint() {
  const std::string path = options_.checkpoint_dir + "/" + options_.client_id + ".pt";
  if (options_.checkpoint_dir.empty() || !options_.env->FileExists(path)) return;
  options_.env->RemoveFile(path);
  spdlog::info("client {}: fresh: removed {} (the run it held is discarded on both sides)", options_.client_id, path);
}

void SplitClient::StopNow() {
  const bool written = !options_.checkpoint_dir.empty() &&
                       (checkpointed_ == client_next_ || TrySaveCheckpoint(client_next_, true));
  throw Interrupted{options_.stop->load(), client_next_, written};
}

int64_t SplitClient::ResumeStep(int64_t server_next) const {
  const std::string sides = "the server has applied " + std::to_string(server_next) + " steps of client " +
                            options_.client_id + ", this client " + std::to_string(client_next_);
  if (server_next > client_next_ + kAnswersKept) {
    const std::string why = sides + ": the server keeps the answers to its last " + std::to_string(kAnswersKept) +
                            " steps only, so steps " + std::to_string(client_next_) + " to " +
                            std::to_string(server_next - kAnswersKept - 1) +
                            " would train this client's layers on answers from server layers that already took them "
                            "(two histories of one model; the client's checkpoint_dir was lost, or its checkpoints failed "
                            "or were written less often than every " + std::to_string(kAnswersKept) + " steps)";
    Require(options_.accept_divergence, ErrorCode::kFailedPrecondition,
            why + ": run again with --fresh to train both halves from step 0, or set accept_divergence: true to "
                  "continue this way");
    spdlog::warn("client {}: {}; continuing (accept_divergence)", options_.client_id, why);
  } else if (server_next < client_next_) {
    spdlog::warn("client {}: {} (the server restarted from an older checkpoint): steps {} to {} are sent again for the "
                 "server only, computed with this client's current weights (the server's checkpoint_every: 1 makes a "
                 "server crash lose none)", options_.client_id, sides, server_next, client_next_ - 1);
  } else if (server_next > 0) {
    spdlog::info("client {}: {}; continuing at step {}", options_.client_id, sides, client_next_);
  }
  return std::min(client_next_, server_next);
}

double SplitClient::Run() {
  if (!options_.checkpoint_dir.empty()) RequireWritableDirectory(options_.checkpoint_dir, "checkpoint_dir", options_.env);
  if (options_.one_step_stale && !options_.checkpoint_dir.empty() && options_.checkpoint_every == 1) {
    spdlog::warn("client {}: one_step_stale overlaps no step across a checkpoint, and checkpoint_every is 1: no step "
                 "overlaps; set checkpoint_every (e.g. 50) to overlap them, at the cost of a restart after a kill "
                 "being refused unless accept_divergence (docs/reliability.md)", options_.client_id);
  }
  client_next_ = LoadCheckpoint();
  // Resume at the earlier of the two sides: steps the server applied after this client's
  // checkpoint are replayed for the client only, steps the client applied after the server's
  // checkpoint are replayed for the server only (TrainStep, SplitServer::Step).
  int64_t step = ResumeStep(RetryTransient("client " + options_.client_id, [this] { return Join(); }));
  if (options_.fresh) RemoveOldCheckpoint();
  if (csv_) csv_->StartAt(step);
  Progress progress("client " + options_.client_id, options_.steps);
  int refusals = 0;
  std::optional<InFlight> next;  // one-step-stale: the step begun while the one before it was in flight
  for (; step < options_.steps; ++step) {
    if (StopRequested() && !next) StopNow();  // the step begun ahead (one step stale) finishes first
    StepRecord r;
    try {
      InFlight current = next ? std::move(*next) : Begin(step, false);
      next.reset();
      if (BeginsNextDuring(current)) next = Begin(step + 1, true);
      r = Finish(current);
      refusals = 0;
    } catch (const Error& e) {
      next.reset();
      // The server restarted from an older checkpoint (a step gap) or lacks what a message builds
      // on (an AQ-SGD cache entry): rejoin, and continue at the earlier of the two sides (as at the
      // start) with a step that builds on nothing the server may lack.
      if (e.code() != ErrorCode::kFailedPrecondition || ++refusals > 3) throw;
      spdlog::warn("client {}: {}; rejoining", options_.client_id, e.what());
      codec_->ForgetHistory();
      step = ResumeStep(RetryTransient("client " + options_.client_id, [this] { return Join(); })) - 1;
      continue;
    }
    char fields[128];
    std::snprintf(fields, sizeof fields, "loss %.3f  up %.2f MB  down %.2f MB  bits %.2f", r.loss,
                  static_cast<double>(r.wire_up) / 1e6, static_cast<double>(r.wire_down) / 1e6, r.average_bits);
    if (options_.progress) progress.Update(step + 1, fields);
    if (options_.eval_every > 0 && (step + 1) % options_.eval_every == 0 && step + 1 < options_.steps) {
      records_.back().metric = Evaluate();
      WriteCsv(records_.back());
      ReportMetric(step + 1, *records_.back().metric);
    }
    if (options_.sync_every > 0 && (step + 1) % options_.sync_every == 0) SyncAdapters();
    if ((step + 1) % options_.checkpoint_every == 0) {
      TrySaveCheckpoint(client_next_, client_next_ % options_.history_every == 0);
    }
  }
  if (!TrySaveCheckpoint(client_next_, true)) {
    spdlog::warn("client {}: evaluating and exporting the adapter all the same (they do not need the checkpoint)",
                 options_.client_id);
  }
  const auto evaluation_started = std::chrono::steady_clock::now();
  std::vector<std::string> predicted;
  const double metric = Evaluate(options_.predictions_path.empty() ? nullptr : &predicted);
  last_evaluation_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - evaluation_started).count();
  if (!options_.predictions_path.empty()) WritePredictions(predicted);
  ReportMetric(step, metric);
  StepRecord last = records_.empty() ? StepRecord{} : records_.back();
  last.step = step - 1;  // the final evaluation's row is that of the last step (the CSV: steps done)
  last.metric = metric;
  last.wire_up = transport_.bytes_up();
  last.wire_down = transport_.bytes_down();
  last.up = last.down = quant::ByteCount{};
  last.seconds = 0;
  records_.push_back(last);
  WriteCsv(last);
  if (options_.progress) progress.Finish((data_.is_classification() ? "accuracy " : "exact match ") + std::to_string(metric));
  if (!options_.adapter_out.empty()) ExportAdapter();
  return metric;
}

void SplitClient::ReportMetric(int64_t steps_done, double metric) {
  try {
    transport_.ReportMetric(steps_done, data_.is_classification() ? "accuracy" : "exact_match", metric);
  } catch (const Error& e) {  // the live view misses a point; training is not affected
    spdlog::warn("the server did not take this client's metric ({}): its live view lacks it", e.what());
  }
}

void SplitClient::ExportAdapter() {
  ServerAdapterInfo server;
  try {
    server = RetryTransient("fetching the server's adapter", [&] { return transport_.FetchAdapter(); });
  } catch (const Error& e) {
    spdlog::warn("the server's LoRA could not be fetched ({}): {} holds this client's layers [0, {}) only", e.what(),
                 options_.adapter_out, options_.cut_layer);
    SavePeftAdapter({&part_}, options_.lora, options_.model_dir, options_.adapter_out);
    return;
  }
  ExportWholeAdapter(part_, server, options_.lora, options_.model_dir, options_.adapter_out, options_.merged_out);
}

}  // namespace amaq::client
