#include "client/split_client.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/checkpoint.h"
#include "common/error.h"
#include "common/evaluate.h"
#include "common/finetune.h"
#include "common/progress.h"
#include "quant/tensor_codec.h"

namespace amaq::client {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> Flat(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kInt).contiguous();
  return std::vector<int32_t>(c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel());
}

}  // namespace

template <typename F>
auto SplitClient::RetryWhileUnavailable(const std::string& what, F attempt) -> decltype(attempt()) {
  const auto started = Clock::now();
  double backoff = 0.5;
  while (true) {
    try {
      return attempt();
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(Clock::now() - started).count();
      if (e.code() != ErrorCode::kUnavailable || waited > options_.retry_seconds) throw;
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
  tokenizer_ = Tokenizer::Load(options_.model_dir);
  encoder_ = std::make_unique<ExampleEncoder>(*tokenizer_, config_.bos_token_id, config_.eos_token_id, options_.max_tokens);
  torch::manual_seed(options_.seed);
  part_ = ModelPart(config_, PartSpec::Client(options_.cut_layer));
  LoadPartWeights(part_, options_.model_dir);
  part_->AddLora(options_.lora, options_.seed);
  const std::vector<torch::Tensor> trainable = part_->TrainableParameters();
  if (!trainable.empty()) {
    optimizer_ = std::make_unique<torch::optim::AdamW>(trainable, torch::optim::AdamWOptions(options_.lr).weight_decay(0.0));
  }
  if (method_.kind == quant::Method::Kind::kAmaq) {
    quant::AmaqOptions a;
    a.bmax = method_.bmax;
    a.bmin = method_.bmin;
    a.alpha = options_.amaq_alpha;
    a.beta = options_.amaq_beta;
    a.gate_lr = options_.amaq_gate_lr;
    a.warmup_steps = options_.amaq_warmup;
    if (method_.budget) {
      a.budget = quant::BitBudgetOptions{*method_.budget, options_.steps, options_.amaq_warmup, options_.amaq_ramp_fraction};
    }
    a.uniform = method_.uniform;
    amaq_ = std::make_unique<quant::AmaqQuantizer>(config_.hidden_size, a);
  }
  if (method_.kind == quant::Method::Kind::kAqsgd) {
    aqsgd_options_.bits = method_.bits;
    aqsgd_options_.cache_memory_bytes = options_.aqsgd_cache_bytes;
    aqsgd_options_.spill_dir = options_.aqsgd_spill_dir;
    aqsgd_ = std::make_unique<quant::AqsgdSender>(aqsgd_options_);
  }
  fingerprint_ = ModelFingerprint(options_.model_dir, options_.cut_layer);
  if (!options_.csv_path.empty()) {
    const bool fresh = !std::filesystem::exists(options_.csv_path) || std::filesystem::file_size(options_.csv_path) == 0;
    csv_.open(options_.csv_path, std::ios::app);
    Require(csv_.good(), ErrorCode::kFailedPrecondition, options_.csv_path + ": cannot write the run's CSV");
    if (fresh) {
      csv_ << "client,method,step,wire_up_bytes,wire_down_bytes,up_payload_bytes,up_metadata_bytes,"
              "down_payload_bytes,down_metadata_bytes,loss,average_bits,metric,seconds,applied\n";
    }
  }
}

SplitClient::~SplitClient() = default;

int64_t SplitClient::Join() {
  const int64_t last = transport_.Join(JoinInfo{options_.client_id, fingerprint_, options_.cut_layer, method_.ToString()});
  train_encoder_.Reset();
  gradient_decoder_.Reset();
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
  const bool fixed_shape = method_.kind == quant::Method::Kind::kAqsgd;
  return encoder_->MakeBatch(examples, ids, true, fixed_shape ? options_.max_tokens : 0);
}

std::vector<uint8_t> SplitClient::EncodeActivation(const torch::Tensor& x, const Batch& b, torch::Tensor* upstream,
                                                   quant::ByteCount* count, double* bits) {
  quant::Encoded e;
  pending_ = WireSpec{x.detach().to(torch::kCPU, torch::kFloat).contiguous(), method_.ActivationBits(),
                      method_.ActivationOptions()};
  switch (method_.kind) {
    case quant::Method::Kind::kAmaq:
      pending_.bits = amaq_->IntegerBits(x.size(0));
      pending_.options = amaq_->WireOptions();
      *upstream = amaq_->Quantize(x, train_encoder_, &e);
      break;
    case quant::Method::Kind::kAqsgd: {
      const torch::Tensor cpu = x.detach().to(torch::kCPU, torch::kFloat).contiguous();
      e = aqsgd_->Encode(cpu.data_ptr<float>(), b.sample_ids, b.ids.size(1), x.size(1));
      *upstream = x;
      break;
    }
    default:
      e = quant::EncodeTensor(train_encoder_, x, method_.ActivationBits(), method_.ActivationOptions());
      *upstream = x;
  }
  *count = e.count;
  *bits = e.average_bits;
  return std::move(e.bytes);
}

std::vector<uint8_t> SplitClient::EncodeForEvaluation(const torch::Tensor& x) {
  quant::EncodeOptions o = method_.ActivationOptions();
  quant::BitsTable bits = method_.ActivationBits();
  if (method_.kind == quant::Method::Kind::kAmaq) {
    bits = amaq_->IntegerBits(x.size(0));
  } else if (method_.kind == quant::Method::Kind::kAqsgd) {
    o.scheme = quant::Scheme::kBFloat16;  // evaluation samples have no AQ-SGD history
  }
  quant::Encoder stateless;  // evaluation messages always carry their bits table
  return quant::EncodeTensor(stateless, x, bits, o).bytes;
}

StepResult SplitClient::Exchange(const StepInput& input) {
  StepInput attempt = input;
  bool retry = false;
  return RetryWhileUnavailable("step " + std::to_string(input.step_id), [&] {
    if (retry) {
      Join();  // fresh codec streams on both sides: re-encode what referred to the old ones
      if (method_.kind != quant::Method::Kind::kAqsgd && input.kind == StepKind::kTrain) {
        attempt.activation = quant::EncodeTensor(train_encoder_, pending_.values, pending_.bits, pending_.options).bytes;
      }
    }
    retry = true;
    return transport_.Step(attempt);
  });
}

StepRecord SplitClient::TrainStep(int64_t step) {
  const auto started = Clock::now();
  part_->train();
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const Batch b = BatchFor(step);
  const int64_t rows = b.ids.size(0) * b.ids.size(1);
  const torch::Tensor x = part_(b.ids, b.mask).reshape({rows, config_.hidden_size});
  StepRecord r;
  r.step = step;
  r.client_seconds = seconds_since(started);
  torch::Tensor upstream;
  StepInput input;
  input.step_id = step;
  input.kind = StepKind::kTrain;
  input.sample_ids = b.sample_ids;
  input.batch = b.ids.size(0);
  input.tokens = b.ids.size(1);
  input.mask = Flat(b.mask);
  input.labels = Flat(b.labels);
  auto mark = Clock::now();
  input.activation = EncodeActivation(x, b, &upstream, &r.up, &r.average_bits);
  r.encode_seconds = seconds_since(mark);
  mark = Clock::now();
  const StepResult result = Exchange(input);
  r.server_seconds = result.server_seconds;
  r.network_seconds = std::max(0.0, seconds_since(mark) - result.server_seconds);

  mark = Clock::now();
  quant::Decoded info;
  const torch::Tensor gradient = quant::DecodeTensor(gradient_decoder_, result.gradient.data(), result.gradient.size(), &info);
  r.encode_seconds += seconds_since(mark);
  mark = Clock::now();
  Require(gradient.size(0) == rows && gradient.size(1) == config_.hidden_size, ErrorCode::kDataLoss,
          "the server's gradient has the wrong shape: the server and client disagree; rejoin");
  r.applied = step >= client_next_;
  if (r.applied && cut_statistics_) cut_statistics_->Add(x, gradient);
  if (r.applied) {
    if (optimizer_) optimizer_->zero_grad();
    if (upstream.requires_grad()) upstream.backward(gradient.to(upstream.scalar_type()));
    if (amaq_) {
      amaq_->Regularizer().backward();
      amaq_->Step();
    }
    if (optimizer_) {
      if (options_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(part_->TrainableParameters(), options_.max_grad_norm);
      optimizer_->step();
    }
    client_next_ = step + 1;
  }
  r.client_seconds += seconds_since(mark);
  r.loss = result.loss;
  r.down = info.count;
  r.wire_up = transport_.bytes_up();
  r.wire_down = transport_.bytes_down();
  r.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  records_.push_back(r);
  WriteCsv(r);
  return r;
}

double SplitClient::Evaluate() {
  torch::NoGradGuard no_grad;
  part_->eval();
  const auto remote = [&](const torch::Tensor& ids, const torch::Tensor& mask, const torch::Tensor& labels, StepKind kind) {
    const int64_t rows = ids.size(0) * ids.size(1);
    StepInput input;
    input.kind = kind;
    input.batch = ids.size(0);
    input.tokens = ids.size(1);
    input.mask = Flat(mask);
    input.labels = labels.defined() ? Flat(labels) : std::vector<int32_t>(static_cast<size_t>(rows), -100);
    input.activation = EncodeForEvaluation(part_(ids, mask).reshape({rows, config_.hidden_size}));
    return Exchange(input);
  };
  const std::vector<Example> examples(data_.validation.begin(),
                                      data_.validation.begin() + std::min<int64_t>(options_.eval_examples, data_.validation.size()));
  if (data_.is_classification()) {
    const SequenceScorer score = [&](const Batch& b) {
      const StepResult r = remote(b.ids, b.mask, b.labels, StepKind::kScore);
      Require(!r.scores.empty() && r.scores.size() % static_cast<size_t>(b.ids.size(0)) == 0, ErrorCode::kDataLoss,
              "the server returned " + std::to_string(r.scores.size()) + " scores for " + std::to_string(b.ids.size(0)) +
                  " rows: the server and this client disagree; update both");
      return torch::tensor(r.scores).view({b.ids.size(0), -1});
    };
    return ClassificationAccuracy(score, *encoder_, data_, examples, options_.eval_batch, config_.max_position_embeddings);
  }
  const GreedyStep step = [&](const torch::Tensor& ids, const torch::Tensor& mask) {
    const StepResult r = remote(ids, mask, torch::Tensor(), StepKind::kNextToken);
    return torch::tensor(r.next_tokens, torch::kLong);
  };
  return ExactMatch(step, *encoder_, examples, 12, options_.eval_batch);
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

std::vector<uint8_t> SplitClient::GateBits() const { return amaq_ ? amaq_->IntegerBits(amaq_->gates().size(0)).bits : std::vector<uint8_t>{}; }

double SplitClient::average_bits() const { return records_.empty() ? 0 : records_.back().average_bits; }

void SplitClient::WriteCsv(const StepRecord& r) {
  if (!csv_.is_open()) return;
  csv_ << options_.client_id << ',' << method_.ToString() << ',' << r.step << ',' << r.wire_up << ',' << r.wire_down << ','
       << r.up.payload << ',' << r.up.metadata << ',' << r.down.payload << ',' << r.down.metadata << ',' << r.loss << ','
       << r.average_bits << ',' << (r.metric ? std::to_string(*r.metric) : "") << ',' << r.seconds << ','
       << (r.applied ? 1 : 0) << '\n';
  csv_.flush();
}

void SplitClient::TrySaveCheckpoint(int64_t next_step) {
  try {
    SaveCheckpoint(next_step);
  } catch (const Error& e) {
    spdlog::error("client {}: checkpoint of step {} failed (the previous one is intact; retrying at the next): {}",
                  options_.client_id, next_step, e.what());
  }
}

void SplitClient::SaveCheckpoint(int64_t next_step) {
  if (options_.checkpoint_dir.empty()) return;
  torch::serialize::OutputArchive archive;
  archive.write("next_step", torch::tensor(next_step));
  for (auto& [name, t] : part_->LoraParameters()) archive.write("lora." + name, t);
  if (optimizer_) {
    torch::serialize::OutputArchive opt;
    optimizer_->save(opt);
    archive.write("optimizer", opt);
  }
  if (amaq_) {
    archive.write("amaq.gates", amaq_->gates());
    torch::serialize::OutputArchive opt;
    amaq_->optimizer().save(opt);
    archive.write("amaq.optimizer", opt);
  }
  std::ostringstream bytes;
  archive.save_to(bytes);
  WriteFileAtomically(options_.checkpoint_dir + "/" + options_.client_id + ".pt", bytes.str());
}

int64_t SplitClient::LoadCheckpoint() {
  const std::string path = options_.checkpoint_dir + "/" + options_.client_id + ".pt";
  if (options_.checkpoint_dir.empty() || !std::filesystem::exists(path)) return 0;
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kDataLoss, path + ": client checkpoint is unreadable (" + e.what_without_backtrace() +
                                          "): move it away to start fresh");
  }
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
  torch::Tensor next;
  archive.read("next_step", next);
  if (amaq_) {
    torch::Tensor gates;
    archive.read("amaq.gates", gates);
    amaq_->gates().copy_(gates);
    torch::serialize::InputArchive opt;
    archive.read("amaq.optimizer", opt);
    amaq_->optimizer().load(opt);
    amaq_->set_step(next.item<int64_t>());
  }
  spdlog::info("client {}: restored its checkpoint of step {}", options_.client_id, next.item<int64_t>());
  return next.item<int64_t>();
}

double SplitClient::Run() {
  if (!options_.checkpoint_dir.empty()) RequireWritableDirectory(options_.checkpoint_dir, "checkpoint_dir");
  client_next_ = LoadCheckpoint();
  // Resume at the earlier of the two sides: steps the server applied after this client's
  // checkpoint are replayed for the client only, steps the client applied after the server's
  // checkpoint are replayed for the server only (TrainStep, SplitServer::Step).
  const int64_t server_next = RetryWhileUnavailable("client " + options_.client_id, [this] { return Join(); });
  int64_t step = std::min(client_next_, server_next);
  if (step > 0 || server_next > 0) {
    spdlog::info("client {}: the server has applied {} steps, this client {}; continuing at step {}", options_.client_id,
                 server_next, client_next_, step);
  }
  Progress progress("client " + options_.client_id, options_.steps);
  int refusals = 0;
  for (; step < options_.steps; ++step) {
    StepRecord r;
    try {
      r = TrainStep(step);
      refusals = 0;
    } catch (const Error& e) {
      // The server restarted from an older checkpoint (a step gap) or lost its AQ-SGD cache:
      // rejoin, start the sender's cache afresh, and continue from the server's step counter.
      if (e.code() != ErrorCode::kFailedPrecondition || ++refusals > 3) throw;
      spdlog::warn("client {}: {}; rejoining", options_.client_id, e.what());
      if (aqsgd_) aqsgd_ = std::make_unique<quant::AqsgdSender>(aqsgd_options_);
      step = RetryWhileUnavailable("client " + options_.client_id, [this] { return Join(); }) - 1;
      continue;
    }
    char fields[128];
    std::snprintf(fields, sizeof fields, "loss %.3f  up %.2f MB  down %.2f MB  bits %.2f", r.loss,
                  static_cast<double>(r.wire_up) / 1e6, static_cast<double>(r.wire_down) / 1e6, r.average_bits);
    if (options_.progress) progress.Update(step + 1, fields);
    if (options_.eval_every > 0 && (step + 1) % options_.eval_every == 0 && step + 1 < options_.steps) {
      records_.back().metric = Evaluate();
      WriteCsv(records_.back());
    }
    if (options_.sync_every > 0 && (step + 1) % options_.sync_every == 0) SyncAdapters();
    if ((step + 1) % options_.checkpoint_every == 0) TrySaveCheckpoint(client_next_);
  }
  SaveCheckpoint(client_next_);
  const double metric = Evaluate();
  StepRecord last = records_.empty() ? StepRecord{} : records_.back();
  last.step = step;
  last.metric = metric;
  last.wire_up = transport_.bytes_up();
  last.wire_down = transport_.bytes_down();
  last.up = last.down = quant::ByteCount{};
  last.seconds = 0;
  records_.push_back(last);
  WriteCsv(last);
  if (options_.progress) progress.Finish((data_.is_classification() ? "accuracy " : "exact match ") + std::to_string(metric));
  if (!options_.adapter_out.empty()) {
    SavePeftAdapter({&part_}, options_.lora, options_.model_dir, options_.adapter_out);
  }
  return metric;
}

}  // namespace amaq::client
