#include "server/split_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "common/base/atomic_file.h"
#include "common/model/archive_check.h"
#include "common/model/checkpoint.h"
#include "common/base/error.h"
#include "common/model/evaluate.h"
#include "quant/checksum.h"
#include "common/model/lora_row_groups.h"
#include "server/step_cost.h"

namespace amaq::server {

struct SplitServer::LoraState {
  std::vector<torch::Tensor> values;  // leaves that require gradients, in TrainableParameters() order
  std::unique_ptr<torch::optim::AdamW> optimizer;  // over values
};

struct SplitServer::Session {
  std::string client_id;
  std::string method_text;                  // canonical; empty until the first Join
  std::string run;                          // JoinInfo::run of the run it holds; empty: none given yet
  std::unique_ptr<quant::ServerCodec> codec;
  std::unique_ptr<LoraState> own;           // per-client LoRA (null when shared)
  int64_t last_applied = -1;
  // The answers to the parts of the last two applied steps (a client one step stale has two in
  // flight), oldest first, kept to answer a retry of them: the replies, and the raw gradients,
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
  Clock::time_point last_seen = Clock::now();  // of the last call of this client (session_ttl_seconds)
  ClientStats stats;
  // NEXT_TOKEN steps with a decoding cache: the server part's keys and values of the sequences
  // being decoded (started by START_CACHE; dropped by any other step, a rejoin, or a failure).
  std::unique_ptr<KvCache> decode_cache;
};

namespace {

torch::Device PickDevice(const std::string& wanted) {
  if (wanted == "cuda" || (wanted == "auto" && torch::cuda::is_available())) {
    Require(torch::cuda::is_available(), ErrorCode::kFailedPrecondition,
            "device 'cuda' was asked for but this LibTorch has no CUDA or no GPU is visible: "
            "set device: cpu, or build against a CUDA LibTorch (-DTorch_DIR=...)");
    return torch::Device(torch::kCUDA, 0);
  }
  Require(wanted == "auto" || wanted == "cpu", ErrorCode::kInvalidArgument,
          "device must be auto, cpu or cuda, got '" + wanted + "'");
  return torch::Device(torch::kCPU);
}

std::string CheckpointPath(const ServerOptions& o) { return o.checkpoint_dir + "/server.pt"; }

std::string SessionsDir(const ServerOptions& o) { return o.checkpoint_dir + "/sessions"; }
std::string HistoriesDir(const ServerOptions& o) { return o.checkpoint_dir + "/histories"; }

// A client's file in `dir`: named by the XXH3 of its id, which may hold any character.
std::string SessionFile(const std::string& dir, const std::string& client_id, const char* extension) {
  char name[17];
  std::snprintf(name, sizeof name, "%016llx",
                static_cast<unsigned long long>(quant::WireChecksum(reinterpret_cast<const uint8_t*>(client_id.data()), client_id.size())));
  return dir + "/" + name + extension;
}

uint64_t Bytes(const torch::Tensor& t) { return t.defined() ? static_cast<uint64_t>(t.nbytes()) : 0; }

// The bytes of a decoding cache's keys, values and mask (0 for none).
uint64_t HeldBytes(const KvCache* cache) {
  if (!cache) return 0;
  uint64_t total = Bytes(cache->seen);
  for (const LayerKv& layer : cache->layers) total += Bytes(layer.keys) + Bytes(layer.values);
  return total;
}

}  // namespace

SplitServer::SplitServer(ServerOptions options) : options_(std::move(options)) {
  config_ = ModelConfig::Load(options_.model_dir + "/config.json");
  Require(options_.cut_layer >= 0 && options_.cut_layer <= config_.num_hidden_layers, ErrorCode::kInvalidArgument,
          "cut_layer " + std::to_string(options_.cut_layer) + " lies outside the model's " +
              std::to_string(config_.num_hidden_layers) + " layers: choose 0.." +
              std::to_string(config_.num_hidden_layers));
  device_ = PickDevice(options_.device);
  device_name_ = device_.is_cuda() ? "cuda:0" : "cpu";
  const uint64_t device_memory = DeviceMemoryBytes(device_.is_cuda(), 0);
  step_budget_ = options_.max_step_memory_mb > 0 ? static_cast<uint64_t>(options_.max_step_memory_mb) << 20 : device_memory / 4;
  client_budget_ = options_.max_client_memory_mb > 0 ? static_cast<uint64_t>(options_.max_client_memory_mb) << 20 : device_memory / 2;
  Require(step_budget_ > 0 && client_budget_ > 0, ErrorCode::kFailedPrecondition,
          "the memory of " + device_name_ + " is unknown (nvidia-smi did not say): set max_step_memory_mb and max_client_memory_mb");
  spdlog::info("a step may need at most {} MiB by its estimate (max_step_memory_mb), with its client's decoding cache {} MiB "
               "(max_client_memory_mb)", step_budget_ >> 20, client_budget_ >> 20);
  const BaseWeights base_weights = ParseBaseWeights(options_.base_weights);
  fingerprint_ = ModelFingerprint(options_.model_dir, options_.cut_layer, base_weights);
  torch::manual_seed(options_.seed);
  part_ = ModelPart(config_, PartSpec::Server(config_, options_.cut_layer), base_weights);
  LoadPartWeights(part_, options_.model_dir);
  part_->AddLora(options_.lora, options_.seed);
  part_->to(device_);
  const NamedTensors named_lora = part_->LoraParameters();
  for (const auto& p : part_->TrainableParameters()) {
    for (const auto& [name, tensor] : named_lora) {
      if (tensor.is_same(p)) lora_names_.push_back(name);
    }
    initial_lora_.push_back(p.detach().clone());
  }
  // The client's layers [0, cut) carry the same LoRA tensors as the server's first layer.
  const std::string first = "model.layers." + std::to_string(options_.cut_layer) + ".";
  for (const auto& [name, tensor] : named_lora) {
    if (name.rfind(first, 0) != 0) continue;
    for (int64_t layer = 0; layer < options_.cut_layer; ++layer) {
      client_lora_shapes_["model.layers." + std::to_string(layer) + "." + name.substr(first.size())] = tensor.sizes().vec();
    }
  }
  if (options_.shared_lora) shared_ = NewLoraState();
  Require(options_.session_ttl_seconds <= 0 || !options_.checkpoint_dir.empty(), ErrorCode::kInvalidArgument,
          "session_ttl_seconds is set without a checkpoint_dir: evicted sessions are kept there; set checkpoint_dir, "
          "or session_ttl_seconds: 0");
  if (!options_.checkpoint_dir.empty()) {
    RequireWritableDirectory(options_.checkpoint_dir, "checkpoint_dir");
    if (std::filesystem::exists(CheckpointPath(options_))) LoadCheckpoint();
  }
  spdlog::info("server part: layers [{}, {}) + head of {} on {}, {} base weights ({:.1f} MB), {} LoRA tensors, "
               "fingerprint {}", options_.cut_layer, config_.num_hidden_layers, options_.model_dir, device_name_,
               options_.base_weights, part_->BaseWeightBytes() / 1e6, lora_names_.size(), fingerprint_);
}

SplitServer::~SplitServer() = default;

StepShapeLimits SplitServer::step_limits() const {
  StepShapeLimits limits;
  limits.max_batch_tokens = options_.max_batch_tokens;
  limits.max_sequence_tokens = options_.max_sequence_tokens > 0
                                   ? std::min(options_.max_sequence_tokens, config_.max_position_embeddings)
                                   : config_.max_position_embeddings;
  limits.vocab_size = config_.vocab_size;
  return limits;
}

std::unique_ptr<SplitServer::LoraState> SplitServer::NewLoraState() {
  auto lora = std::make_unique<LoraState>();
  for (const auto& t : initial_lora_) lora->values.push_back(t.clone().requires_grad_(true));
  lora->optimizer = std::make_unique<torch::optim::AdamW>(lora->values, torch::optim::AdamWOptions(options_.lr).weight_decay(0.0));
  return lora;
}

SplitServer::LoraState& SplitServer::LoraOf(Session& s) { return s.own ? *s.own : *shared_; }

int64_t SplitServer::Join(const std::string& client_id, const std::string& fingerprint, int64_t cut_layer,
                          const std::string& method, const std::string& run, RunStart start) {
  Require(!client_id.empty() && client_id.size() <= 128, ErrorCode::kInvalidArgument,
          "client_id must be 1..128 characters");
  Require(cut_layer == options_.cut_layer, ErrorCode::kFailedPrecondition,
          "client splits at layer " + std::to_string(cut_layer) + " but this server runs from layer " +
              std::to_string(options_.cut_layer) + ": set the same cut_layer on both sides");
  Require(fingerprint == fingerprint_, ErrorCode::kFailedPrecondition,
          "the client's model (fingerprint " + Excerpt(fingerprint) + ") differs from the server's (" + fingerprint_ +
              "): give both sides the same base model directory and the same base_weights");
  Require(method.size() <= 256, ErrorCode::kInvalidArgument,
          "method name of " + std::to_string(method.size()) + " characters: use a method of docs/amaq.md");
  Require(run.size() <= 1024, ErrorCode::kInvalidArgument,
          "a run of " + std::to_string(run.size()) + " bytes: at most 1024 (docs/protocol.md, \"Runs\")");
  const std::unique_ptr<quant::Method> parsed = quant::Method::Parse(method);
  if (start != RunStart::kFresh) {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    if (!sessions_.count(client_id)) return JoinLocked(client_id, *parsed, run, start);  // a session not in memory is in no step
  }
  std::lock_guard<std::mutex> step(step_mutex_);
  bool forgot = false;
  if (start == RunStart::kFresh) {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    forgot = ForgetLocked(client_id);
  }
  if (forgot) CheckpointLocked();  // the last checkpoint still holds what was discarded
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  return JoinLocked(client_id, *parsed, run, start);
}

bool SplitServer::ForgetLocked(const std::string& client_id) {
  const auto it = sessions_.find(client_id);
  const int64_t steps = it == sessions_.end() ? 0 : it->second->stats.steps;
  bool had = it != sessions_.end();
  if (had) sessions_.erase(it);
  published_.erase(client_id);
  for (const std::string& path : {options_.checkpoint_dir.empty() ? std::string() : EvictedPath(client_id),
                                  CodecContextFor(client_id).history_file}) {
    std::error_code ec;
    if (!path.empty() && std::filesystem::remove(path, ec)) had = true;
  }
  if (had) spdlog::info("client {}: a fresh run: its stored session ({} steps applied) is discarded", client_id, steps);
  return had;
}

int64_t SplitServer::JoinLocked(const std::string& client_id, const quant::Method& method, const std::string& run, RunStart start) {
  const std::string canonical = method.ToString();
  auto it = sessions_.find(client_id);
  if (it == sessions_.end()) {
    std::unique_ptr<Session> session = LoadEvicted(client_id);
    if (!session) {
      session = std::make_unique<Session>();
      session->client_id = client_id;
      if (!options_.shared_lora) session->own = NewLoraState();
    }
    it = sessions_.emplace(client_id, std::move(session)).first;
  }
  Session& s = *it->second;
  s.last_seen = Clock::now();
  if (!run.empty() && !s.run.empty() && s.run != run && start == RunStart::kContinue) {
    throw Error(ErrorCode::kFailedPrecondition,
                "client " + client_id + ": the server holds another run of this client (" + std::to_string(s.stats.steps) +
                    " steps applied): " + RunMismatch(s.run, run) + "; or use another client_id");
  }
  Require(s.method_text.empty() || s.method_text == canonical, ErrorCode::kInvalidArgument,
          "client " + client_id + " trained with method " + s.method_text + " and now asks for " + canonical +
              ": keep the method, set fresh: true to discard the stored run, or use a new client_id");
  if (!run.empty()) s.run = run;
  if (!s.codec) s.codec = method.MakeServerCodec(CodecContextFor(client_id));
  s.method_text = canonical;
  s.codec->Reset();  // a (re)joining client starts fresh codec streams; AQ-SGD caches survive
  s.decode_cache.reset();
  PublishLocked(s);
  spdlog::info("client {} joined: method {}, last applied step {}", client_id, s.method_text, s.last_applied);
  return s.last_applied;
}

void SplitServer::PublishLocked(const Session& s) {
  ClientStats& shown = published_[s.client_id];
  shown = s.stats;
  shown.method = s.method_text;
}

SplitServer::Session& SplitServer::SessionOf(const std::string& client_id) {
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  const auto it = sessions_.find(client_id);
  Require(it != sessions_.end() && !it->second->method_text.empty(), ErrorCode::kFailedPrecondition,
          "client " + client_id + " has not joined, or its session was evicted after session_ttl_seconds idle: call Join "
          "(it resumes an evicted session)");
  it->second->last_seen = Clock::now();
  return *it->second;
}

quant::CodecContext SplitServer::CodecContextFor(const std::string& client_id) const {
  quant::CodecContext context;
  context.channels = config_.hidden_size;
  context.cache_bytes = static_cast<uint64_t>(options_.aqsgd_cache_mb) << 20;
  if (!options_.aqsgd_spill_dir.empty()) context.spill_dir = SessionFile(options_.aqsgd_spill_dir, client_id, "");
  if (!options_.checkpoint_dir.empty()) context.history_file = SessionFile(HistoriesDir(options_), client_id, ".aqsgd");
  return context;
}

struct SplitServer::Admitted {
  BatchEntry* entry;
  Session* session;
  torch::Tensor activation;  // [batch, tokens, hidden], fp32, CPU
  Received received;
};

StepResult SplitServer::Step(const std::string& client_id, const StepInput& in) {
  std::vector<BatchEntry> batch(1);
  batch[0].client_id = client_id;
  batch[0].input = &in;
  StepBatch(batch);
  if (batch[0].error) std::rethrow_exception(batch[0].error);
  return std::move(batch[0].result);
}

void SplitServer::StepBatch(std::vector<BatchEntry>& batch) {
  std::lock_guard<std::mutex> step(step_mutex_);
  std::vector<const Session*> touched;  // refused steps count their bytes too
  const auto started = Clock::now();
  std::vector<Admitted> train, replays;
  std::set<std::string> clients, in_batch;
  for (const BatchEntry& e : batch) in_batch.insert(e.client_id);
  for (BatchEntry& e : batch) {
    try {
      Require(clients.insert(e.client_id).second, ErrorCode::kInternal,
              "two steps of client " + e.client_id + " in one batch: batch at most one step per client");
      Session& s = SessionOf(e.client_id);
      touched.push_back(&s);
      const StepInput& in = *e.input;
      if (in.cache == DecodeCache::kNone) s.decode_cache.reset();
      CheckStepFields(in, step_limits());
      if (std::optional<StepResult> stored = AnswerRetry(s, in)) {
        e.result = std::move(*stored);
        continue;
      }
      const StepCost cost = AdmitCost(s, in);
      const bool replay = Admit(s, in, started);
      KeepSessionsWithinBudget(in_batch, s, in, cost);
      Received received;
      torch::Tensor activation = Decode(s, in, &received);
      if (in.kind != StepKind::kTrain) {
        e.result = Evaluate(s, in, activation);
        continue;
      }
      (replay ? replays : train).push_back({&e, &s, std::move(activation), std::move(received)});
    } catch (...) {
      e.error = std::current_exception();
    }
  }
  // A failure of the shared compute (a LibTorch error, memory) fails the steps that were in it.
  const auto train_batch = [&](std::vector<Admitted>& steps, bool are_replays) {
    try {
      TrainBatch(steps, started, are_replays);
    } catch (...) {
      for (Admitted& a : steps) {
        if (!a.entry->error) a.entry->error = std::current_exception();
      }
    }
  };
  if (!train.empty()) train_batch(train, false);
  for (Admitted& replay : replays) {  // alone: their losses must not reach a shared LoRA's step
    std::vector<Admitted> one{std::move(replay)};
    train_batch(one, true);
  }
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  for (const Session* s : touched) PublishLocked(*s);
  uint64_t bytes = 0;
  for (const auto& [id, s] : sessions_) bytes += SessionBytes(*s);
  sessions_bytes_ = bytes;
}

std::optional<StepResult> SplitServer::AnswerRetry(Session& s, const StepInput& in) {
  if (in.kind != StepKind::kTrain) return std::nullopt;
  const auto part = static_cast<size_t>(in.micro_batch);
  const auto applied = std::find_if(s.applied.begin(), s.applied.end(), [&](const Session::Answers& a) {
    return a.step == in.step_id && a.replies.size() == static_cast<size_t>(in.micro_batches);
  });
  const bool received = in.step_id == s.partial_step && s.partial_parts == in.micro_batches && part < s.partial_replies.size();
  if (applied == s.applied.end() && !received) return std::nullopt;
  StepResult again = received ? s.partial_replies[part] : applied->replies[part];
  const torch::Tensor& g = received ? s.partial_gradients[part] : applied->gradients[part];
  // The retry may be the first message on a fresh stream (its client rejoined): the stream must
  // learn its bits table, and the gradient goes back in the format that answers it.
  s.codec->Reread(in.activation.data(), in.activation.size(),
                  quant::SampleRows{in.batch, in.tokens, in.sample_ids, in.micro_batch}, config_.hidden_size);
  again.gradient = s.codec->EncodeGradient(g.data_ptr<float>(), g.size(0), g.size(1)).bytes;
  s.stats.gradient_bytes += again.gradient.size();
  return again;
}

StepCost SplitServer::AdmitCost(const Session& s, const StepInput& in) const {
  const int64_t server_layers = config_.num_hidden_layers - options_.cut_layer;
  const bool extends = in.cache == DecodeCache::kExtend && s.decode_cache;
  const int64_t cached = extends ? s.decode_cache->length() : 0;
  const StepCost cost = EstimateStepCost(config_, server_layers, options_.lora.rank, in, cached);
  const auto mib = [](uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; };
  const std::string step = "step " + std::to_string(in.step_id) + " of client " + s.client_id + " (" +
                           std::to_string(in.batch) + " x " + std::to_string(in.tokens) + " tokens)";
  Require(cost.bytes <= step_budget_, ErrorCode::kResourceExhausted,
          step + " needs about " + mib(cost.bytes) + " on the server, over its limit of " + mib(step_budget_) +
              " per step (max_step_memory_mb): send fewer rows or tokens per step, or raise the limit");
  Require(cost.bytes + cost.kept_bytes <= client_budget_, ErrorCode::kResourceExhausted,
          step + " needs about " + mib(cost.bytes) + " on the server and leaves " + mib(cost.kept_bytes) +
              " in its decoding cache, over the limit of " + mib(client_budget_) +
              " per client (max_client_memory_mb): decode shorter sequences or fewer rows, or raise the limit");
  return cost;
}

uint64_t SplitServer::SessionBytes(const Session& s) const {
  uint64_t total = (s.codec ? s.codec->memory_bytes() : 0) + HeldBytes(s.decode_cache.get());
  for (const Session::Answers& a : s.applied) {
    for (const torch::Tensor& g : a.gradients) total += Bytes(g);
  }
  for (const torch::Tensor& g : s.partial_gradients) total += Bytes(g);
  if (s.own) {
    for (const torch::Tensor& v : s.own->values) total += 3 * Bytes(v);  // the values and AdamW's two moments
  }
  return total;
}

void SplitServer::KeepSessionsWithinBudget(const std::set<std::string>& batch, const Session& s, const StepInput& in,
                                           const StepCost& cost) {
  if (options_.max_sessions_memory_mb <= 0) return;
  const auto budget = static_cast<uint64_t>(options_.max_sessions_memory_mb * (1 << 20));
  const uint64_t cached = HeldBytes(s.decode_cache.get());  // the decoding cache this step replaces or extends
  const uint64_t rows = static_cast<uint64_t>(in.batch * in.tokens), row = static_cast<uint64_t>(config_.hidden_size) * 4;
  const uint64_t stored = in.kind == StepKind::kTrain ? rows * row * (s.codec->memory_bytes() > 0 ? 2 : 1) : 0;
  const uint64_t adds = (cost.kept_bytes > cached ? cost.kept_bytes - cached : 0) + stored;
  std::unique_lock<std::mutex> lock(sessions_mutex_);
  uint64_t total = 0, movable = 0;
  std::vector<std::pair<Clock::time_point, std::string>> others;  // sessions that may move to disk
  for (const auto& [id, other] : sessions_) {
    const uint64_t bytes = SessionBytes(*other);
    total += bytes;
    if (!batch.count(id) && other->partial_step < 0) {  // not amid a step sent in parts
      others.emplace_back(other->last_seen, id);
      movable += bytes;
    }
  }
  if (total + adds <= budget) return;
  std::sort(others.begin(), others.end());
  const auto mib = [](uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; };
  const std::string over = "the server's sessions hold " + mib(total) + " and step " + std::to_string(in.step_id) +
                           " of client " + s.client_id + " adds about " + mib(adds) + ", over max_sessions_memory_mb (" +
                           mib(budget) + ")";
  Require(!options_.checkpoint_dir.empty(), ErrorCode::kResourceExhausted,
          over + ", and without checkpoint_dir no session can move to disk: raise max_sessions_memory_mb or set checkpoint_dir "
                 "(the step was not applied; send it again later)");
  Require(total - movable + adds <= budget, ErrorCode::kResourceExhausted,
          over + " even with every other session on disk: raise max_sessions_memory_mb, or send fewer rows or shorter "
                 "sequences (the step was not applied)");
  for (size_t i = 0; total + adds > budget; ++i) {
    total -= SessionBytes(*sessions_.at(others[i].second));
    EvictLocked(others[i].second, "to keep max_sessions_memory_mb");
  }
  lock.unlock();
  TryCheckpointLocked();  // without them (until it succeeds, their files are the newer state)
}

bool SplitServer::Admit(const Session& s, const StepInput& in, Clock::time_point now) const {
  if (in.kind != StepKind::kTrain) return false;
  Require(in.step_id <= s.last_applied + 1, ErrorCode::kFailedPrecondition,
          "client " + s.client_id + " sent step " + std::to_string(in.step_id) + " but the server applied up to " +
              std::to_string(s.last_applied) + ": resume from step " + std::to_string(s.last_applied + 1));
  if (options_.max_steps_per_second > 0 && s.last_applied >= 0) {
    const double since = std::chrono::duration<double>(now - s.last_step_at).count();
    Require(since >= 1.0 / options_.max_steps_per_second, ErrorCode::kResourceExhausted,
            "client " + s.client_id + " exceeds the server's limit of " + std::to_string(options_.max_steps_per_second) +
                " steps per second: slow down (the step was not applied; send it again later)");
  }
  Require(in.micro_batches == 1 || takes_micro_batches(), ErrorCode::kFailedPrecondition,
          "client " + s.client_id + " sends steps in " + std::to_string(in.micro_batches) +
              " parts, but a shared server LoRA takes whole steps (parts of several clients would mix in its "
              "gradient): set micro_batches 1 on the client");
  if (in.step_id <= s.last_applied) return true;  // applied before a restart: answer, do not apply
  Require(in.micro_batch == 0 || (s.partial_step == in.step_id && s.partial_parts == in.micro_batches &&
                                  s.partial_replies.size() == static_cast<size_t>(in.micro_batch)),
          ErrorCode::kFailedPrecondition,
          "client " + s.client_id + " sent part " + std::to_string(in.micro_batch) + " of step " + std::to_string(in.step_id) +
              " without its earlier parts (the server restarted, evicted the session or refused one): send the step again "
              "from its first part");
  return false;
}

torch::Tensor SplitServer::Decode(Session& s, const StepInput& in, Received* received) {
  const int64_t rows = in.batch * in.tokens;
  quant::ServerCodec::Activation a =
      in.kind == StepKind::kTrain
          ? s.codec->DecodeTraining(in.activation.data(), in.activation.size(),
                                    quant::SampleRows{in.batch, in.tokens, in.sample_ids}, config_.hidden_size)
          : s.codec->DecodeEvaluation(in.activation.data(), in.activation.size(), rows, config_.hidden_size);
  s.stats.activation_bytes += a.count.total();  // bytes received, refused or not
  received->average_bits = a.average_bits;
  received->width_shares = std::move(a.width_shares);
  auto* owned = new std::vector<float>(std::move(a.values));
  return torch::from_blob(owned->data(), {in.batch, in.tokens, config_.hidden_size},
                          [owned](void*) { delete owned; }, torch::kFloat);
}

namespace {

torch::Tensor StepTensor(const std::vector<int32_t>& values, const StepInput& in, torch::Device device) {
  return torch::from_blob(const_cast<int32_t*>(values.data()), {in.batch, in.tokens}, torch::kInt).to(device, torch::kLong);
}

}  // namespace

StepResult SplitServer::Evaluate(Session& s, const StepInput& in, const torch::Tensor& activation) {
  torch::NoGradGuard no_grad;
  const LoraRowGroups lora(part_, {0, in.batch}, {&LoraOf(s).values});
  part_->eval();
  const torch::Tensor mask = StepTensor(in.mask, in, device_);
  const torch::Tensor x = activation.to(device_, part_->compute_dtype());
  StepResult result;
  result.step_id = in.step_id;
  result.average_bits = s.stats.average_bits;
  if (in.cache != DecodeCache::kNone) {
    const torch::Tensor next = NextTokensCached(s, in, x, mask).to(torch::kCPU).contiguous();
    result.next_tokens.assign(next.data_ptr<int64_t>(), next.data_ptr<int64_t>() + next.numel());
    return result;
  }
  if (in.kind == StepKind::kScore) {
    const torch::Tensor labels = StepTensor(in.labels, in, device_);
    const torch::Tensor logits = part_->LogitsAtLabels(x, mask, labels);
    const torch::Tensor scores = SequenceLogProbs(logits, labels, mask).to(torch::kCPU, torch::kFloat).contiguous();
    result.scores.assign(scores.data_ptr<float>(), scores.data_ptr<float>() + scores.numel());
  } else {
    const torch::Tensor next = LastTokenArgmax(part_(x, mask), mask).to(torch::kCPU).contiguous();
    result.next_tokens.assign(next.data_ptr<int64_t>(), next.data_ptr<int64_t>() + next.numel());
  }
  return result;
}

torch::Tensor SplitServer::NextTokensCached(Session& s, const StepInput& in, const torch::Tensor& x, const torch::Tensor& mask) {
  if (in.cache == DecodeCache::kStart) s.decode_cache = std::make_unique<KvCache>();
  Require(s.decode_cache != nullptr, ErrorCode::kFailedPrecondition,
          "client " + s.client_id + " extends sequences the server does not hold (it restarted, or the client rejoined): "
          "send the sequences again with cache START_CACHE");
  KvCache& cache = *s.decode_cache;
  const int64_t length = cache.length() + in.tokens;
  try {
    Require(cache.length() == 0 || cache.seen.size(0) == in.batch, ErrorCode::kInvalidArgument,
            "the step extends " + std::to_string(in.batch) + " sequences, the decoding cache holds " +
                std::to_string(cache.seen.size(0)) + ": extend every started row by one token");
    Require(length <= step_limits().max_sequence_tokens && in.batch * length <= options_.max_batch_tokens,
            ErrorCode::kInvalidArgument,
            "decoded sequences would reach " + std::to_string(length) + " tokens per row, " + std::to_string(in.batch * length) +
                " in all: above max_sequence_tokens or max_batch_tokens; generate fewer tokens or smaller batches");
    return LastColumnArgmax(part_->ForwardCached(x, mask, cache));
  } catch (...) {
    s.decode_cache.reset();  // half-extended layers: nothing of it is worth keeping
    throw;
  }
}

namespace {

// values [B, T, ...] padded with `fill` to [B, tokens, ...] along the token dimension.
torch::Tensor PadTokens(const torch::Tensor& values, int64_t tokens, double fill) {
  if (values.size(1) == tokens) return values;
  std::vector<int64_t> pad(2 * (values.dim() - 1), 0);
  pad.back() = tokens - values.size(1);  // constant_pad_nd lists the last dimension first
  return torch::constant_pad_nd(values, pad, fill);
}

}  // namespace

void SplitServer::TrainBatch(std::vector<Admitted>& steps, Clock::time_point started, bool replays) {
  // Rows of every step, padded at the end to the longest (masked, unlabelled: a causal model's
  // earlier tokens never see them).
  int64_t tokens = 0;
  for (const Admitted& a : steps) tokens = std::max(tokens, a.entry->input->tokens);
  std::vector<torch::Tensor> xs, masks, labels;
  std::vector<int64_t> row_starts{0};
  std::vector<const std::vector<torch::Tensor>*> adapters;
  for (const Admitted& a : steps) {
    const StepInput& in = *a.entry->input;
    xs.push_back(PadTokens(a.activation, tokens, 0));
    masks.push_back(PadTokens(StepTensor(in.mask, in, torch::kCPU), tokens, 0));
    labels.push_back(PadTokens(StepTensor(in.labels, in, torch::kCPU), tokens, -100));
    row_starts.push_back(row_starts.back() + in.batch);
    adapters.push_back(&LoraOf(*a.session).values);
  }
  const torch::Tensor x = torch::cat(xs).to(device_, part_->compute_dtype()).detach().requires_grad_(true);
  xs.clear();
  part_->train();
  torch::Tensor hidden;  // the layers' output for every row, before the final norm and head
  {
    const LoraRowGroups lora(part_, row_starts, adapters);
    hidden = part_->Body(x, torch::cat(masks).to(device_));
  }
  // The head, loss and their backward one step at a time, into the gradient of the layers' output:
  // only one step's logits are held at once, and only at its labelled positions (AtLabels).
  const torch::Tensor head_input = hidden.detach().requires_grad_(true);
  const torch::Tensor all_labels = torch::cat(labels).to(device_);
  // A step's parts add their gradients up: they are cleared at its first part (and for replays,
  // which apply nothing; a replay also abandons a step whose parts were arriving).
  for (const Admitted& a : steps) {
    Session& s = *a.session;
    if (replays || a.entry->input->micro_batch == 0) {
      LoraOf(s).optimizer->zero_grad();
      s.partial_step = replays ? -1 : a.entry->input->step_id;
      s.partial_parts = a.entry->input->micro_batches;
      s.partial_replies.clear();
      s.partial_gradients.clear();
      s.partial_loss = 0;
    }
  }
  // Step i's rows of a batch tensor, without the padding.
  const auto rows = [&](const torch::Tensor& t, size_t i) {
    return t.slice(0, row_starts[i], row_starts[i + 1]).slice(1, 0, steps[i].entry->input->tokens);
  };
  std::vector<LoraState*> trained;  // each LoRA with a step of finite loss, once, in the order of the steps
  std::vector<bool> finite(steps.size(), false);
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepInput& in = *steps[i].entry->input;
    const torch::Tensor step_labels = rows(all_labels, i);
    torch::Tensor loss = NextTokenLoss(part_->Head(AtLabels(rows(head_input, i), step_labels)), step_labels);
    if (in.loss_scale != 1) loss = loss * in.loss_scale;
    StepResult& result = steps[i].entry->result;
    result.step_id = in.step_id;
    result.duplicate = replays;
    result.loss = loss.item<float>();
    if (!std::isfinite(result.loss)) {
      steps[i].session->partial_step = -1;  // its parts must come again from the first
      steps[i].entry->error = std::make_exception_ptr(
          Error(ErrorCode::kInvalidArgument, "the loss of step " + std::to_string(in.step_id) +
                                                 " is not finite: training diverged; lower the learning rates"));
      continue;
    }
    finite[i] = true;
    loss.backward();
    LoraState* lora = &LoraOf(*steps[i].session);
    const bool last_part = in.micro_batch == in.micro_batches - 1;
    if (last_part && std::find(trained.begin(), trained.end(), lora) == trained.end()) trained.push_back(lora);
  }
  if (std::none_of(finite.begin(), finite.end(), [](bool f) { return f; })) return;
  hidden.backward(head_input.grad());
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::vector<torch::Tensor> gradients(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!finite[i]) continue;
    const StepInput& in = *steps[i].entry->input;
    Session& s = *steps[i].session;
    gradients[i] = rows(x.grad(), i).reshape({in.batch * in.tokens, config_.hidden_size}).to(torch::kCPU, torch::kFloat).contiguous();
    StepResult& result = steps[i].entry->result;
    result.gradient = s.codec->EncodeGradient(gradients[i].data_ptr<float>(), gradients[i].size(0), gradients[i].size(1)).bytes;
    result.server_seconds = seconds;
    s.stats.gradient_bytes += result.gradient.size();  // sent, applied or not
  }
  if (replays) return;
  for (LoraState* lora : trained) {
    if (options_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(lora->values, options_.max_grad_norm);
    lora->optimizer->step();
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!finite[i]) continue;
    Session& s = *steps[i].session;
    const StepInput& in = *steps[i].entry->input;
    StepResult stored = steps[i].entry->result;
    stored.duplicate = true;  // what a retry of it gets (its gradient encoded again)
    stored.gradient.clear();
    s.partial_replies.push_back(std::move(stored));
    s.partial_gradients.push_back(std::move(gradients[i]));
    s.partial_loss += steps[i].entry->result.loss;
    if (in.micro_batch == in.micro_batches - 1) Commit(s, in, steps[i].received, started);
  }
  if (!trained.empty()) CheckpointIfDue();  // once a step commits: a failed one retries at the next step, not part
}

// The step's update (its parts' answers are in s.partial_*) and everything that records it.
void SplitServer::Commit(Session& s, const StepInput& in, const Received& received, Clock::time_point started) {
  s.last_applied = in.step_id;
  s.last_step_at = started;
  s.applied.push_back({in.step_id, std::move(s.partial_replies), std::move(s.partial_gradients)});
  if (s.applied.size() > 2) s.applied.pop_front();
  s.partial_replies.clear();
  s.partial_gradients.clear();
  s.partial_step = -1;
  const float loss = s.partial_loss;  // the step's: its parts' scaled losses summed
  ++s.stats.steps;
  s.stats.last_loss = loss;
  s.stats.average_bits = received.average_bits;
  s.stats.last_step_seconds = s.applied.back().replies.back().server_seconds;
  history_.RecordStep(s.client_id,  // numbered by steps done, as the client's evaluations are
                      {in.step_id + 1, std::chrono::duration<double>(started - started_).count(), loss,
                       received.average_bits, s.stats.activation_bytes, s.stats.gradient_bytes},
                      received.width_shares);
  ++applied_since_checkpoint_;
}

void SplitServer::CheckpointIfDue() {
  if (applied_since_checkpoint_ >= options_.checkpoint_every) TryCheckpointLocked();
}

void SplitServer::TryCheckpointLocked() {
  // A failed checkpoint between steps (disk full, folder gone) must not fail the step: the previous
  // checkpoint stays, the error is logged and counted, and the next step tries again. Checkpoint()
  // (at shutdown) does throw.
  try {
    CheckpointLocked();
  } catch (const Error& e) {
    ++checkpoint_failures_;
    spdlog::error("checkpoint failed (the previous one is intact; retrying after the next step): {}", e.what());
  }
}

uint64_t SplitServer::adapter_bytes() const {
  uint64_t elements = 0;
  for (const auto& [name, shape] : client_lora_shapes_) {
    elements += static_cast<uint64_t>(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()));
  }
  return elements * 4;
}

void SplitServer::CheckAdapter(const NamedFloats& tensors) const {
  Require(!client_lora_shapes_.empty(), ErrorCode::kFailedPrecondition,
          "adapter averaging needs client and server layers on both sides of the cut (cut_layer " +
              std::to_string(options_.cut_layer) + " of " + std::to_string(config_.num_hidden_layers) +
              "): turn sync_every off on the clients");
  Require(tensors.size() == client_lora_shapes_.size(), ErrorCode::kInvalidArgument,
          "the adapter has " + std::to_string(tensors.size()) + " tensors, the client layers' LoRA has " +
              std::to_string(client_lora_shapes_.size()) + ": use the server's LoRA settings (rank, targets) on the client");
  for (const auto& [name, tensor] : tensors) {
    const auto expected = client_lora_shapes_.find(name);
    Require(expected != client_lora_shapes_.end(), ErrorCode::kInvalidArgument,
            "the adapter's tensor '" + Excerpt(name) + "' is not a LoRA tensor of the client's layers: use the server's LoRA settings");
    int64_t elements = 1;
    for (const int64_t d : tensor.shape) elements *= d;
    Require(tensor.shape == expected->second && static_cast<int64_t>(tensor.values.size()) == elements,
            ErrorCode::kInvalidArgument,
            "the adapter's tensor " + name + " has another shape or value count than the LoRA settings give: use the "
            "server's LoRA settings");
    for (const float v : tensor.values) {
      if (!(std::isfinite(v) && std::fabs(v) <= kMaxAdapterValue)) {  // not Require: its message would be built per value
        throw Error(ErrorCode::kInvalidArgument, "the adapter's tensor " + name + " holds " + std::to_string(v) +
                                                     ": LoRA values must be finite and within +-" + std::to_string(kMaxAdapterValue) +
                                                     "; the client's training diverged: lower its learning rate");
      }
    }
  }
}

NamedFloats SplitServer::AverageAdapters(const std::string& client_id, const NamedFloats& tensors, int* clients) {
  CheckAdapter(tensors);
  std::lock_guard<std::mutex> step(step_mutex_);
  SessionOf(client_id);
  adapters_[client_id] = tensors;
  std::vector<const NamedFloats*> uploads;
  for (const auto& [id, upload] : adapters_) uploads.push_back(&upload);
  *clients = static_cast<int>(adapters_.size());
  return AggregateAdapters(uploads, tensors, options_.averaging);
}

ServerAdapterInfo SplitServer::AdapterOf(const std::string& client_id) {
  std::lock_guard<std::mutex> step(step_mutex_);
  Session& s = SessionOf(client_id);
  ServerAdapterInfo info;
  const std::vector<torch::Tensor>& lora = LoraOf(s).values;
  for (size_t i = 0; i < lora.size(); ++i) {
    const torch::Tensor values = lora[i].detach().to(torch::kCPU, torch::kFloat).contiguous();
    info.tensors[lora_names_[i]] = NamedFloat{values.sizes().vec(),
                                    std::vector<float>(values.data_ptr<float>(), values.data_ptr<float>() + values.numel())};
  }
  info.shared = !s.own;
  info.lora_rank = options_.lora.rank;
  info.lora_alpha = options_.lora.alpha;
  info.target_modules = options_.lora.target_modules;
  info.applied_steps = s.stats.steps;
  return info;
}

std::map<std::string, ClientStats> SplitServer::Stats() const {
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  return published_;
}

void SplitServer::ReportMetric(const std::string& client_id, int64_t step, const std::string& name, double value) {
  Require(!name.empty() && name.size() <= 64, ErrorCode::kInvalidArgument,
          "a metric's name must be 1..64 characters, got " + std::to_string(name.size()) + ": use accuracy or exact_match");
  Require(std::isfinite(value), ErrorCode::kInvalidArgument, "metric " + Excerpt(name) + " is not finite: report a number");
  Require(step >= 0, ErrorCode::kInvalidArgument, "a metric's step must be >= 0, got " + std::to_string(step));
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  SessionOf(client_id);
  history_.RecordMetric(client_id, {step, seconds, value}, name);
}

namespace {

void SaveLora(torch::serialize::OutputArchive& archive, const std::string& prefix, const std::vector<torch::Tensor>& values,
              torch::optim::AdamW& optimizer) {
  for (size_t i = 0; i < values.size(); ++i) archive.write(prefix + ".lora." + std::to_string(i), values[i].to(torch::kCPU));
  torch::serialize::OutputArchive opt;
  optimizer.save(opt);
  archive.write(prefix + ".optimizer", opt);
}

void LoadLora(torch::serialize::InputArchive& archive, const std::string& prefix, std::vector<torch::Tensor>& values,
              torch::optim::AdamW& optimizer) {
  for (size_t i = 0; i < values.size(); ++i) {
    torch::Tensor t;
    archive.read(prefix + ".lora." + std::to_string(i), t);
    torch::NoGradGuard no_grad;
    values[i].copy_(t);
  }
  torch::serialize::InputArchive opt;
  archive.read(prefix + ".optimizer", opt);
  optimizer.load(opt);
}

}  // namespace

void SplitServer::Checkpoint() {
  std::lock_guard<std::mutex> step(step_mutex_);
  CheckpointLocked();
}

void SplitServer::CheckpointLocked() {
  if (options_.checkpoint_dir.empty()) return;
  std::lock_guard<std::mutex> lock(sessions_mutex_);  // a first Join waits: the map is walked
  torch::serialize::OutputArchive archive;
  std::string clients;
  for (const auto& [id, s] : sessions_) {
    clients += id + "\n";
    SaveSession(archive, *s);
  }
  archive.write("clients", c10::IValue(clients));
  // Collaborative mode: each client's latest adapter upload, so that an average after a restart
  // still covers the clients that synced before it.
  std::string uploaders;
  for (const auto& [id, tensors] : adapters_) {
    uploaders += id + "\n";
    std::string names;
    int64_t i = 0;
    for (const auto& [name, t] : tensors) {
      names += name + "\n";
      archive.write("adapter." + id + "." + std::to_string(i++), torch::tensor(t.values).view(t.shape));
    }
    archive.write("adapter." + id + ".names", c10::IValue(names));
  }
  archive.write("adapter_clients", c10::IValue(uploaders));
  if (shared_) {
    SaveLora(archive, "shared", shared_->values, *shared_->optimizer);
  }
  std::ostringstream bytes;
  archive.save_to(bytes);
  WriteFileAtomically(CheckpointPath(options_), bytes.str());
  applied_since_checkpoint_ = 0;
  // The checkpoint now holds every session in memory: an evicted copy of one is out of date.
  for (const auto& [id, s] : sessions_) std::filesystem::remove(EvictedPath(id));
}

void SplitServer::SaveSession(torch::serialize::OutputArchive& archive, Session& s) {
  const std::string key = "client." + s.client_id;
  archive.write(key + ".method", c10::IValue(s.method_text));
  archive.write(key + ".run", c10::IValue(s.run));
  archive.write(key + ".last_applied", torch::tensor(s.last_applied));
  archive.write(key + ".applied_steps", torch::tensor(s.stats.steps));
  if (s.own) SaveLora(archive, key, s.own->values, *s.own->optimizer);
  SaveAnswers(archive, key, s);
  if (s.codec) s.codec->SaveHistory();  // a file of its own, of any age: safe with the checkpoint before or after it
}

std::unique_ptr<SplitServer::Session> SplitServer::LoadSession(torch::serialize::InputArchive& archive, const std::string& id) {
  auto s = std::make_unique<Session>();
  s->client_id = id;
  const std::string key = "client." + id;
  c10::IValue method;
  archive.read(key + ".method", method);
  s->method_text = method.toStringRef();
  c10::IValue run;
  if (archive.try_read(key + ".run", run)) s->run = run.toStringRef();  // absent from checkpoints before runs
  s->codec = quant::Method::Parse(s->method_text)->MakeServerCodec(CodecContextFor(id));
  try {
    s->codec->LoadHistory();
  } catch (const Error& e) {  // it only saves bytes: the client sends the samples in full again
    spdlog::warn("client {}: {}; continuing without it", id, e.what());
  }
  torch::Tensor last;
  archive.read(key + ".last_applied", last);
  s->last_applied = last.item<int64_t>();
  torch::Tensor applied;
  archive.read(key + ".applied_steps", applied);
  s->stats.steps = applied.item<int64_t>();
  if (!options_.shared_lora) {
    s->own = NewLoraState();
    LoadLora(archive, key, s->own->values, *s->own->optimizer);
  }
  LoadAnswers(archive, key, *s);
  return s;
}

// The stored answers are kept in checkpoints: a client killed before its own checkpoint held a
// step sends it again, and gets the same gradient from a restarted server as from this one.
void SplitServer::SaveAnswers(torch::serialize::OutputArchive& archive, const std::string& key, const Session& s) {
  for (size_t j = 0; j < s.applied.size(); ++j) {
    const Session::Answers& a = s.applied[j];
    const std::string answers = key + ".answers." + std::to_string(j);
    std::vector<double> numbers;  // per part: loss, average bits, server seconds
    for (const StepResult& r : a.replies) numbers.insert(numbers.end(), {r.loss, r.average_bits, r.server_seconds});
    archive.write(answers + ".step", torch::tensor(a.step));
    archive.write(answers + ".numbers", torch::tensor(numbers, torch::kDouble));
    for (size_t p = 0; p < a.gradients.size(); ++p) archive.write(answers + ".gradient." + std::to_string(p), a.gradients[p]);
  }
}

void SplitServer::LoadAnswers(torch::serialize::InputArchive& archive, const std::string& key, Session& s) const {
  for (int j = 0;; ++j) {  // the stored answers (absent from checkpoints before they were kept)
    const std::string answers = key + ".answers." + std::to_string(j);
    torch::Tensor step, numbers;
    if (!archive.try_read(answers + ".step", step)) break;
    archive.read(answers + ".numbers", numbers);
    Require(numbers.dim() == 1 && numbers.size(0) % 3 == 0, ErrorCode::kDataLoss,
            "client " + s.client_id + ": the checkpoint's stored answers are malformed: move the checkpoint away to start fresh");
    Session::Answers a{step.item<int64_t>(), {}, {}};
    for (int64_t p = 0; p < numbers.size(0) / 3; ++p) {
      StepResult r;
      r.step_id = a.step;
      r.duplicate = true;
      r.loss = static_cast<float>(numbers[3 * p].item<double>());
      r.average_bits = numbers[3 * p + 1].item<double>();
      r.server_seconds = numbers[3 * p + 2].item<double>();
      a.replies.push_back(r);
      torch::Tensor g;
      archive.read(answers + ".gradient." + std::to_string(p), g);
      Require(g.scalar_type() == torch::kFloat && g.dim() == 2 && g.size(1) == config_.hidden_size, ErrorCode::kDataLoss,
              "client " + s.client_id + ": a stored answer's gradient in the checkpoint is not [rows, " +
                  std::to_string(config_.hidden_size) + "] fp32: move the checkpoint away to start fresh");
      a.gradients.push_back(g.contiguous());
    }
    s.applied.push_back(std::move(a));
  }
}

std::string SplitServer::EvictedPath(const std::string& client_id) const {
  return SessionFile(SessionsDir(options_), client_id, ".pt");
}

std::unique_ptr<SplitServer::Session> SplitServer::LoadEvicted(const std::string& client_id) {
  if (options_.checkpoint_dir.empty()) return nullptr;
  const std::string path = EvictedPath(client_id);
  if (!std::filesystem::exists(path)) return nullptr;
  torch::serialize::InputArchive archive;
  c10::IValue id;
  try {
    archive.load_from(path);
    archive.read("client", id);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kDataLoss, path + ": an evicted session is unreadable (" + e.what_without_backtrace() +
                                          "): move it away to start client " + client_id + " afresh");
  }
  if (id.toStringRef() != client_id) return nullptr;  // another id with the same hash: that client is not this one
  RequireFiniteArchive(archive, path);
  spdlog::info("client {}: resuming its evicted session from {}", client_id, path);
  return LoadSession(archive, client_id);
}

int SplitServer::EvictIdle(const std::set<std::string>& connected) {
  if (options_.session_ttl_seconds <= 0) return 0;
  std::lock_guard<std::mutex> step(step_mutex_);
  std::unique_lock<std::mutex> lock(sessions_mutex_);
  const auto now = Clock::now();
  std::vector<std::string> idle;
  for (const auto& [id, s] : sessions_) {
    if (!connected.count(id) && std::chrono::duration<double>(now - s->last_seen).count() >= options_.session_ttl_seconds) {
      idle.push_back(id);
    }
  }
  if (idle.empty()) return 0;
  for (const std::string& id : idle) EvictLocked(id, "after " + std::to_string(options_.session_ttl_seconds) + " s idle");
  lock.unlock();
  CheckpointLocked();  // without them: their files are the newer state
  return static_cast<int>(idle.size());
}

void SplitServer::EvictLocked(const std::string& id, const std::string& why) {
  std::filesystem::create_directories(SessionsDir(options_));
  torch::serialize::OutputArchive archive;
  archive.write("client", c10::IValue(id));
  SaveSession(archive, *sessions_.at(id));
  std::ostringstream bytes;
  archive.save_to(bytes);
  WriteFileAtomically(EvictedPath(id), bytes.str());
  sessions_.erase(id);
  published_.erase(id);
  ++sessions_evicted_;
  spdlog::info("client {}: session evicted {} (kept in {})", id, why, EvictedPath(id));
}

size_t SplitServer::sessions_in_memory() const {
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  return sessions_.size();
}

void SplitServer::LoadCheckpoint() {
  const std::string path = CheckpointPath(options_);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kDataLoss, path + ": server checkpoint is unreadable (" + e.what_without_backtrace() +
                                          "): move it away to start fresh");
  }
  RequireFiniteArchive(archive, path);
  c10::IValue clients;
  archive.read("clients", clients);
  std::istringstream ids(clients.toStringRef());
  for (std::string id; std::getline(ids, id);) {
    std::unique_ptr<Session> s = LoadSession(archive, id);
    // A session evicted after this checkpoint was written: its file is the newer state.
    std::unique_ptr<Session> evicted = LoadEvicted(id);
    if (evicted && evicted->stats.steps > s->stats.steps) continue;
    PublishLocked(*s);  // the constructor's: nothing else runs yet
    sessions_.emplace(id, std::move(s));
  }
  if (shared_) LoadLora(archive, "shared", shared_->values, *shared_->optimizer);
  c10::IValue uploaders;
  if (archive.try_read("adapter_clients", uploaders)) {  // absent from checkpoints of older servers
    std::istringstream uploader_ids(uploaders.toStringRef());
    for (std::string id; std::getline(uploader_ids, id);) {
      c10::IValue names;
      archive.read("adapter." + id + ".names", names);
      std::istringstream lines(names.toStringRef());
      NamedFloats tensors;
      int64_t i = 0;
      for (std::string name; std::getline(lines, name);) {
        torch::Tensor t;
        archive.read("adapter." + id + "." + std::to_string(i++), t);
        t = t.to(torch::kFloat).contiguous();
        tensors[name] = NamedFloat{t.sizes().vec(), std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel())};
      }
      adapters_[id] = std::move(tensors);
    }
  }
  spdlog::info("resumed {} client sessions ({} adapter uploads) from {}", sessions_.size(), adapters_.size(), path);
}

}  // namespace amaq::server
