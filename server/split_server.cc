#include "server/split_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "common/model/compute_dtype.h"
#include "common/model/evaluate.h"
#include "common/model/lora_row_groups.h"
#include "server/step_cost.h"

namespace amaq::server {

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
  part_->set_compute_dtype(ParseComputeDtype(options_.compute_dtype, device_));
  const NamedTensors named_lora = part_->LoraParameters();
  std::vector<torch::Tensor> initial_lora;  // the seeded start of every LoRA the sessions train
  for (const auto& p : part_->TrainableParameters()) {
    for (const auto& [name, tensor] : named_lora) {
      if (tensor.is_same(p)) lora_names_.push_back(name);
    }
    initial_lora.push_back(p.detach().clone());
  }
  // The client's layers [0, cut) carry the same LoRA tensors as the server's first layer.
  const std::string first = "model.layers." + std::to_string(options_.cut_layer) + ".";
  for (const auto& [name, tensor] : named_lora) {
    if (name.rfind(first, 0) != 0) continue;
    for (int64_t layer = 0; layer < options_.cut_layer; ++layer) {
      client_lora_shapes_["model.layers." + std::to_string(layer) + "." + name.substr(first.size())] = tensor.sizes().vec();
    }
  }
  store_ = std::make_unique<SessionStore>(options_, config_, std::move(initial_lora));
  spdlog::info("server part: layers [{}, {}) + head of {} on {}, {} base weights ({:.1f} MB) computing in {}, {} LoRA "
               "tensors, fingerprint {}", options_.cut_layer, config_.num_hidden_layers, options_.model_dir, device_name_,
               options_.base_weights, part_->BaseWeightBytes() / 1e6, compute_dtype(), lora_names_.size(), fingerprint_);
}

SplitServer::~SplitServer() = default;

std::string SplitServer::compute_dtype() const { return ComputeDtypeName(part_->compute_dtype()); }

StepShapeLimits SplitServer::step_limits() const {
  StepShapeLimits limits;
  limits.max_batch_tokens = options_.max_batch_tokens;
  limits.max_sequence_tokens = options_.max_sequence_tokens > 0
                                   ? std::min(options_.max_sequence_tokens, config_.max_position_embeddings)
                                   : config_.max_position_embeddings;
  limits.vocab_size = config_.vocab_size;
  return limits;
}

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
  const int64_t last = [&] {
    if (start != RunStart::kFresh) {
      if (const std::optional<int64_t> absent = store_->JoinAbsent(client_id, *parsed, run, start)) return *absent;
    }
    std::lock_guard<std::mutex> step(step_mutex_);
    if (start == RunStart::kFresh) store_->Forget(client_id);
    return store_->Join(client_id, *parsed, run, start);
  }();
  history_.RecordJoin(client_id, run, last + 1, std::chrono::duration<double>(Clock::now() - started_).count());
  return last;
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
      Session& s = store_->Joined(e.client_id);
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
      store_->KeepWithinBudget(in_batch, s, in, AddedBytes(s, in, cost));
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
  store_->Publish(touched);
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

uint64_t SplitServer::AddedBytes(const Session& s, const StepInput& in, const StepCost& cost) const {
  const uint64_t cached = SessionStore::HeldBytes(s.decode_cache.get());  // the decoding cache this step replaces or extends
  const uint64_t rows = static_cast<uint64_t>(in.batch * in.tokens), row = static_cast<uint64_t>(config_.hidden_size) * 4;
  const uint64_t stored = in.kind == StepKind::kTrain ? rows * row * (s.codec->memory_bytes() > 0 ? 2 : 1) : 0;
  return (cost.kept_bytes > cached ? cost.kept_bytes - cached : 0) + stored;
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
  const LoraRowGroups lora(part_, {0, in.batch}, {&store_->LoraOf(s).values});
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
    const torch::Tensor scores =
        TargetLogProbs(part_->Body(x, mask), [this](const torch::Tensor& h) { return part_->Head(h); }, in.targets)
            .to(torch::kCPU, torch::kFloat)
            .contiguous();
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

struct SplitServer::Forward {
  torch::Tensor x;           // every step's activation, padded: a leaf whose gradient is the cut's
  torch::Tensor hidden;      // the layers' output for every row, before the final norm and head
  torch::Tensor head_input;  // hidden, detached: the head's and the losses' backward ends here
  torch::Tensor labels;
  std::vector<int64_t> row_starts{0};
  // Step i's rows of a batch tensor, without the padding.
  torch::Tensor Rows(const torch::Tensor& t, const std::vector<Admitted>& steps, size_t i) const {
    return t.slice(0, row_starts[i], row_starts[i + 1]).slice(1, 0, steps[i].entry->input->tokens);
  }
};

void SplitServer::TrainBatch(std::vector<Admitted>& steps, Clock::time_point started, bool replays) {
  Forward f = RunForward(steps);
  StartSteps(steps, replays);
  std::vector<bool> finite(steps.size(), false);
  const std::vector<LoraState*> trained = Losses(steps, f, replays, &finite);
  if (std::none_of(finite.begin(), finite.end(), [](bool ok) { return ok; })) return;
  f.hidden.backward(f.head_input.grad());
  std::vector<torch::Tensor> gradients = Answer(steps, f, finite, started);
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
  if (!trained.empty()) store_->CheckpointIfDue();  // once a step commits: a failed one retries at the next step, not part
}

SplitServer::Forward SplitServer::RunForward(const std::vector<Admitted>& steps) {
  // Rows of every step, padded at the end to the longest (masked, unlabelled: a causal model's
  // earlier tokens never see them).
  int64_t tokens = 0;
  for (const Admitted& a : steps) tokens = std::max(tokens, a.entry->input->tokens);
  Forward f;
  std::vector<torch::Tensor> xs, masks, labels;
  std::vector<const std::vector<torch::Tensor>*> adapters;
  for (const Admitted& a : steps) {
    const StepInput& in = *a.entry->input;
    xs.push_back(PadTokens(a.activation, tokens, 0));
    masks.push_back(PadTokens(StepTensor(in.mask, in, torch::kCPU), tokens, 0));
    labels.push_back(PadTokens(StepTensor(in.labels, in, torch::kCPU), tokens, -100));
    f.row_starts.push_back(f.row_starts.back() + in.batch);
    adapters.push_back(&store_->LoraOf(*a.session).values);
  }
  f.x = torch::cat(xs).to(device_, part_->compute_dtype()).detach().requires_grad_(true);
  xs.clear();
  part_->train();
  {
    const LoraRowGroups lora(part_, f.row_starts, adapters);
    f.hidden = part_->Body(f.x, torch::cat(masks).to(device_));
  }
  // The head, loss and their backward go one step at a time (Losses), into the gradient of the
  // layers' output: only one step's logits are held at once, and only at its labelled positions.
  f.head_input = f.hidden.detach().requires_grad_(true);
  f.labels = torch::cat(labels).to(device_);
  return f;
}

void SplitServer::StartSteps(const std::vector<Admitted>& steps, bool replays) {
  // A step's parts add their gradients up: they are cleared at its first part (and for replays,
  // which apply nothing; a replay also abandons a step whose parts were arriving).
  for (const Admitted& a : steps) {
    Session& s = *a.session;
    if (replays || a.entry->input->micro_batch == 0) {
      store_->LoraOf(s).optimizer->zero_grad();
      s.partial_step = replays ? -1 : a.entry->input->step_id;
      s.partial_parts = a.entry->input->micro_batches;
      s.partial_replies.clear();
      s.partial_gradients.clear();
      s.partial_loss = 0;
    }
  }
}

std::vector<LoraState*> SplitServer::Losses(std::vector<Admitted>& steps, Forward& f, bool replays, std::vector<bool>* finite) {
  std::vector<LoraState*> trained;  // each LoRA with a step of finite loss, once, in the order of the steps
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepInput& in = *steps[i].entry->input;
    const torch::Tensor step_labels = f.Rows(f.labels, steps, i);
    torch::Tensor loss = NextTokenLoss(part_->Head(AtLabels(f.Rows(f.head_input, steps, i), step_labels)), step_labels);
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
    (*finite)[i] = true;
    loss.backward();
    LoraState* lora = &store_->LoraOf(*steps[i].session);
    const bool last_part = in.micro_batch == in.micro_batches - 1;
    if (last_part && std::find(trained.begin(), trained.end(), lora) == trained.end()) trained.push_back(lora);
  }
  return trained;
}

std::vector<torch::Tensor> SplitServer::Answer(std::vector<Admitted>& steps, Forward& f, const std::vector<bool>& finite,
                                               Clock::time_point started) {
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::vector<torch::Tensor> gradients(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!finite[i]) continue;
    const StepInput& in = *steps[i].entry->input;
    Session& s = *steps[i].session;
    gradients[i] = f.Rows(f.x.grad(), steps, i).reshape({in.batch * in.tokens, config_.hidden_size}).to(torch::kCPU, torch::kFloat).contiguous();
    StepResult& result = steps[i].entry->result;
    result.gradient = s.codec->EncodeGradient(gradients[i].data_ptr<float>(), gradients[i].size(0), gradients[i].size(1)).bytes;
    result.server_seconds = seconds;
    s.stats.gradient_bytes += result.gradient.size();  // sent, applied or not
  }
  return gradients;
}

// The step's update (its parts' answers are in s.partial_*) and everything that records it.
void SplitServer::Commit(Session& s, const StepInput& in, const Received& received, Clock::time_point started) {
  s.last_applied = in.step_id;
  s.last_step_at = started;
  s.applied.push_back({in.step_id, std::move(s.partial_replies), std::move(s.partial_gradients)});
  if (s.applied.size() > static_cast<size_t>(kAnswersKept)) s.applied.pop_front();
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
  store_->NoteApplied();
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
  store_->Joined(client_id);
  const std::vector<const NamedFloats*> uploads = store_->StoreUpload(client_id, tensors);
  *clients = static_cast<int>(uploads.size());
  return AggregateAdapters(uploads, tensors, options_.averaging);
}

bool SplitServer::WithSharedLora(const std::function<void(const std::vector<torch::Tensor>&)>& f) {
  std::lock_guard<std::mutex> step(step_mutex_);
  LoraState* shared = store_->shared();
  if (!shared) return false;
  std::vector<torch::Tensor> values;
  for (const auto& v : shared->values) values.push_back(v.detach());
  f(values);
  return true;
}

ServerAdapterInfo SplitServer::AdapterOf(const std::string& client_id) {
  std::lock_guard<std::mutex> step(step_mutex_);
  Session& s = store_->Joined(client_id);
  ServerAdapterInfo info;
  const std::vector<torch::Tensor>& lora = store_->LoraOf(s).values;
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

void SplitServer::ReportMetric(const std::string& client_id, int64_t step, const std::string& name, double value) {
  Require(!name.empty() && name.size() <= 64, ErrorCode::kInvalidArgument,
          "a metric's name must be 1..64 characters, got " + std::to_string(name.size()) + ": use accuracy or exact_match");
  Require(std::isfinite(value), ErrorCode::kInvalidArgument, "metric " + Excerpt(name) + " is not finite: report a number");
  Require(step >= 0, ErrorCode::kInvalidArgument, "a metric's step must be >= 0, got " + std::to_string(step));
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  store_->Joined(client_id);
  history_.RecordMetric(client_id, {step, seconds, value}, name);
}

void SplitServer::Checkpoint() {
  std::lock_guard<std::mutex> step(step_mutex_);
  store_->Checkpoint();
}

int SplitServer::EvictIdle(const std::set<std::string>& connected) {
  if (options_.session_ttl_seconds <= 0) return 0;  // without waiting for a step
  std::lock_guard<std::mutex> step(step_mutex_);
  return store_->EvictIdle(connected);
}

}  // namespace amaq::server
