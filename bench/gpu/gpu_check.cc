// amaq-gpu-check: the checks scripts/gpu-check runs where a CUDA LibTorch is found. It links only
// the torch libraries (no gRPC, no protobuf), so it builds on a GPU host that has nothing else.
//
//   split       fp32 split training, the server's layers on --server-device and the client's on
//               the CPU, follows unsplit training on the CPU step for step: the largest relative
//               loss difference over the steps must stay within --tolerance. Exit 1 otherwise.
//               --adapter-out / --merged-out: the run's whole adapter (both halves), and the base
//               with it merged, as the client writes them.
//   throughput  the server's layers (forward + backward through LoRA, the work of one step) on
//               --device: samples/s and tokens/s per batch size, one JSON line per batch.
//   batching    the server's compute stage (SplitServer + StepWorker) on --device under N replaying
//               clients, each step alone and batched: samples/s, p50/p99 latency, one JSON line each.
//   logits      the logits of a model directory for --ids, as float32 [T, V] in --out; with
//               --adapter-out, first a LoRA with random A and B is added, written there as a PEFT
//               adapter and merged, so that PEFT's logits for that adapter can be compared; with
//               --adapter, a PEFT adapter (amaq's or peft's own) is loaded and merged first. With
//               --greedy N, also the N tokens greedy decoding continues --ids with, through the
//               KV-cached decoder amaq-generate uses (no stop at EOS).
//   tokenize    the token ids amaq's tokenizer of a model directory gives each text of --texts (a
//               JSON array of strings; special tokens parsed), as one JSON line.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "inproc/direct_transport.h"
#include "client/split_client.h"
#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "common/model/decoders.h"
#include "common/model/finetune.h"
#include "common/text/tokenizer.h"
#include "common/text/datasets.h"
#include "bench/gpu/replay_clients.h"
#include "server/split_server.h"

using namespace amaq;

namespace {

LoraConfig EveryProjection(int64_t rank) {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 2.0 * static_cast<double>(rank);
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return lora;
}

struct SplitCheck {
  std::string model_dir = "models/amaq-base";
  std::string server_device = "cuda";
  int64_t steps = 20;
  double tolerance = 1e-4;
  std::string adapter_out, merged_out;  // empty: not written
};

int RunSplit(const SplitCheck& c) {
  const Dataset data = MakeArithmetic(2, 2000, 16, 0, 7);
  FinetuneOptions local;
  local.model_dir = c.model_dir;
  local.lora = EveryProjection(8);
  local.lr = 1e-3;
  local.steps = c.steps;
  local.batch = 8;
  local.eval_examples = 4;
  local.seed = 7;
  local.progress = false;
  const FinetuneResult reference = FinetuneLocal(data, local);

  server::ServerOptions so;
  so.model_dir = c.model_dir;
  so.device = c.server_device;
  so.lora = local.lora;
  so.lr = local.lr;
  so.seed = local.seed;
  so.compute_dtype = "fp32";  // as the unsplit reference (auto would be bf16 on a GPU or a CPU with bf16 arithmetic)
  server::SplitServer server(so);
  client::ClientOptions co;
  co.model_dir = c.model_dir;
  co.cut_layer = so.cut_layer;
  co.method = "fp32";
  co.compute_dtype = "fp32";
  co.lora = local.lora;
  co.lr = local.lr;
  co.steps = c.steps;
  co.batch = local.batch;
  co.seed = local.seed;
  co.eval_examples = local.eval_examples;
  co.progress = false;
  co.adapter_out = c.adapter_out;
  co.merged_out = c.merged_out;
  inproc::DirectTransport transport(server);
  client::SplitClient client(co, data, transport);
  client.Run();

  double worst = 0;
  for (int64_t i = 0; i < c.steps; ++i) {
    const double want = reference.losses[static_cast<size_t>(i)];
    const double got = client.records()[static_cast<size_t>(i)].loss;
    worst = std::max(worst, std::fabs(got - want) / std::max(std::fabs(want), 1e-6));
  }
  const bool ok = worst <= c.tolerance;
  std::printf("{\"check\": \"split\", \"server_device\": \"%s\", \"steps\": %lld, \"loss_first\": %.6f, "
              "\"loss_last\": %.6f, \"max_relative_loss_difference\": %.3g, \"tolerance\": %.3g, \"ok\": %s}\n",
              server.device().c_str(), static_cast<long long>(c.steps), reference.losses.front(),
              reference.losses.back(), worst, c.tolerance, ok ? "true" : "false");
  if (!ok) spdlog::error("split training on {} left unsplit CPU training by {:.3g} (relative), more than {:.3g}",
                         server.device(), worst, c.tolerance);
  return ok ? 0 : 1;
}

struct ThroughputCheck {
  std::string model_dir = "models/amaq-base";
  std::string shape = "model";  // model: model_dir's config; 1b: a TinyLlama-1.1B-shaped config
  std::string device = "cuda";
  std::string dtype = "float32";
  int64_t cut_layer = 2;
  int64_t tokens = 128;
  std::vector<int64_t> batches = {1, 8, 32, 64};
  double seconds = 3;
};

// TinyLlama-1.1B's shape (22 layers of 2048, grouped-query attention): weights dominate memory and
// the matrix products are large enough to occupy an accelerator.
ModelConfig OneBillionShape() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.num_hidden_layers = 22;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  c.Validate("1b shape");
  return c;
}

void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

int RunThroughput(const ThroughputCheck& c) {
  const ModelConfig config = c.shape == "1b" ? OneBillionShape() : ModelConfig::Load(c.model_dir + "/config.json");
  Require(c.device == "cpu" || torch::cuda::is_available(), ErrorCode::kFailedPrecondition,
          "--device cuda but this LibTorch sees no GPU: use --device cpu, or run on a host with a CUDA LibTorch");
  const torch::Device device(c.device == "cuda" ? torch::kCUDA : torch::kCPU);
  const torch::Dtype dtype = c.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
  torch::manual_seed(1);
  ModelPart part(config, PartSpec::Server(config, c.cut_layer));  // random weights: only the time matters
  part->AddLora(EveryProjection(16), 1);
  part->to(device, dtype);
  for (const int64_t batch : c.batches) {
    const torch::Tensor x0 = torch::randn({batch, c.tokens, config.hidden_size}, torch::TensorOptions(dtype).device(device));
    const torch::Tensor mask = torch::ones({batch, c.tokens}, torch::TensorOptions(torch::kLong).device(device));
    const torch::Tensor labels = torch::randint(config.vocab_size, {batch, c.tokens}, torch::TensorOptions(torch::kLong).device(device));
    auto step = [&] {
      const torch::Tensor x = x0.detach().requires_grad_(true);
      NextTokenLoss(part->LogitsAtLabels(x, mask, labels), labels).backward();
      for (auto& p : part->TrainableParameters()) p.mutable_grad().reset();
    };
    step();  // warm-up: kernels chosen, memory pools filled
    Synchronize(device);
    int64_t iterations = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < c.seconds || iterations < 2) {
      step();
      Synchronize(device);
      ++iterations;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    const double samples = static_cast<double>(iterations * batch) / elapsed;
    std::printf("{\"check\": \"throughput\", \"device\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", \"server_layers\": %lld, "
                "\"batch\": %lld, \"tokens\": %lld, \"iterations\": %lld, \"samples_per_s\": %.2f, \"tokens_per_s\": %.0f, "
                "\"ms_per_step\": %.2f}\n",
                c.device.c_str(), c.dtype.c_str(), c.shape.c_str(),
                static_cast<long long>(config.num_hidden_layers - c.cut_layer), static_cast<long long>(batch),
                static_cast<long long>(c.tokens), static_cast<long long>(iterations), samples,
                samples * static_cast<double>(c.tokens), 1000.0 * elapsed / static_cast<double>(iterations));
    std::fflush(stdout);
  }
  return 0;
}

struct BatchingCheck {
  bench::ReplayOptions replay;
  std::vector<int> clients = {1, 8, 64};
  int64_t batch_tokens = 65536;
};

int RunBatching(BatchingCheck c) {
  spdlog::set_level(spdlog::level::warn);  // not a line per joining replay client
  for (const int clients : c.clients) {
    c.replay.clients = clients;
    double alone = 0;
    for (const int64_t batch_tokens : {int64_t{0}, c.batch_tokens}) {
      c.replay.batch_tokens = batch_tokens;
      const bench::ReplayRound r = bench::RunReplay(c.replay);
      if (batch_tokens == 0) alone = r.samples_per_second;
      std::printf("{\"check\": \"batching\", \"device\": \"%s\", \"clients\": %d, \"steps\": %lld, \"batch_tokens\": %lld, "
                  "\"samples_per_s\": %.2f, \"speedup\": %.2f, \"p50_ms\": %.1f, \"p99_ms\": %.1f, \"failed\": %d}\n",
                  c.replay.device.c_str(), clients, static_cast<long long>(c.replay.steps), static_cast<long long>(batch_tokens),
                  r.samples_per_second, r.samples_per_second / alone, r.p50_ms, r.p99_ms, r.failures);
      std::fflush(stdout);
      if (r.failures > 0) return 1;
    }
  }
  return 0;
}

struct LogitsCheck {
  std::string model_dir;
  std::vector<int64_t> ids;
  std::string out;
  std::string adapter_out;
  uint64_t lora_seed = 5;
  std::string adapter;  // a PEFT adapter to load and merge first
  int64_t greedy = 0;
};

// The model of c.model_dir, with c.adapter merged in when given (it must cover every LoRA tensor).
ModelPart LoadForLogits(const LogitsCheck& c, const ModelConfig& config) {
  if (!c.adapter.empty()) {
    MergedModel merged = LoadMergedModel(c.model_dir, c.adapter);
    Require(merged.covered == merged.lora_tensors, ErrorCode::kDataLoss,
            c.adapter + " holds " + std::to_string(merged.covered) + " of the model's " +
                std::to_string(merged.lora_tensors) + " LoRA tensors: give an adapter of every layer");
    return merged.model;
  }
  ModelPart model(config, PartSpec::Whole(config));
  LoadPartWeights(model, c.model_dir);
  return model;
}

// The `count` tokens greedy decoding continues `ids` [1, T] with, as a JSON list.
std::string GreedyTokens(ModelPart& model, const torch::Tensor& ids, int64_t count) {
  CachedDecoder decoder(model);
  torch::Tensor logits = decoder.Prefill(ids, torch::ones_like(ids)).first;
  std::string list;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t token = logits.select(1, logits.size(1) - 1).argmax(-1)[0].item<int64_t>();
    list += (t ? ", " : "") + std::to_string(token);
    if (t + 1 < count) logits = decoder.Extend(torch::tensor({token}, torch::kLong));
  }
  return "[" + list + "]";
}

int RunLogits(const LogitsCheck& c) {
  Require(c.adapter.empty() || c.adapter_out.empty(), ErrorCode::kInvalidArgument,
          "--adapter loads an adapter and --adapter-out writes a random one: give one of them");
  const ModelConfig config = ModelConfig::Load(c.model_dir + "/config.json");
  ModelPart model = LoadForLogits(c, config);
  if (!c.adapter_out.empty()) {
    const LoraConfig lora = EveryProjection(8);
    model->AddLora(lora, c.lora_seed);
    {
      // B starts at zero (the adapter changes nothing); a random B makes the comparison mean something.
      torch::NoGradGuard no_grad;
      torch::manual_seed(c.lora_seed);
      for (auto& [name, tensor] : model->LoraParameters()) {
        if (name.find("lora_B") != std::string::npos) tensor.normal_(0, 0.05);
      }
    }
    SavePeftAdapter({&model}, lora, c.model_dir, c.adapter_out);
    model->MergeLora();
  }
  model->eval();
  torch::NoGradGuard no_grad;
  const auto t = static_cast<int64_t>(c.ids.size());
  const torch::Tensor ids = torch::tensor(c.ids, torch::kLong).reshape({1, t});
  const torch::Tensor logits = model(ids, torch::ones({1, t}, torch::kLong)).reshape({t, config.vocab_size}).to(torch::kFloat).contiguous();
  std::ofstream out(c.out, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data_ptr<float>()), static_cast<std::streamsize>(logits.numel() * sizeof(float)));
  Require(static_cast<bool>(out), ErrorCode::kFailedPrecondition, "could not write " + c.out + ": check the folder exists and the disk has room");
  const std::string greedy = c.greedy > 0 ? GreedyTokens(model, ids, c.greedy) : "[]";
  std::printf("{\"check\": \"logits\", \"tokens\": %lld, \"vocab\": %lld, \"out\": \"%s\", \"greedy\": %s}\n",
              static_cast<long long>(t), static_cast<long long>(config.vocab_size), c.out.c_str(), greedy.c_str());
  return 0;
}

struct TokenizeCheck {
  std::string model_dir;
  std::string texts;
};

int RunTokenize(const TokenizeCheck& c) {
  std::ifstream in(c.texts);
  Require(in.good(), ErrorCode::kNotFound, c.texts + ": cannot open the texts (a JSON array of strings)");
  nlohmann::json texts;
  try {
    texts = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, c.texts + ": not JSON (" + std::string(e.what()) + "): give a JSON array of strings");
  }
  Require(texts.is_array(), ErrorCode::kInvalidArgument, c.texts + ": give a JSON array of strings");
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(c.model_dir, SpecialTokens::kParse);
  nlohmann::json ids = nlohmann::json::array();
  for (const nlohmann::json& text : texts) ids.push_back(tokenizer->Encode(text.get<std::string>()));
  std::printf("%s\n", nlohmann::json({{"check", "tokenize"}, {"ids", ids}}).dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"amaq-gpu-check: split equivalence, server throughput, and logits and token ids for the interop checks (scripts/gpu-check)"};
  app.require_subcommand(1);
  SplitCheck split;
  CLI::App* s = app.add_subcommand("split", "fp32 split training (server on --server-device) against unsplit CPU training");
  s->add_option("--model", split.model_dir, "model directory")->capture_default_str();
  s->add_option("--server-device", split.server_device, "where the server's layers run")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  s->add_option("--steps", split.steps, "training steps")->check(CLI::Range(1, 10000))->capture_default_str();
  s->add_option("--tolerance", split.tolerance, "largest relative loss difference allowed")->capture_default_str();
  s->add_option("--adapter-out", split.adapter_out, "write the run's whole adapter (both halves) here");
  s->add_option("--merged-out", split.merged_out, "write the base with that adapter merged here (needs --adapter-out)");
  ThroughputCheck throughput;
  CLI::App* t = app.add_subcommand("throughput", "samples/s of the server's layers, forward and backward");
  t->add_option("--model", throughput.model_dir, "model directory whose config gives the shape (--shape model)")->capture_default_str();
  t->add_option("--shape", throughput.shape, "model: --model's config; 1b: TinyLlama-1.1B's shape, random weights")->check(CLI::IsMember({"model", "1b"}))->capture_default_str();
  t->add_option("--device", throughput.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  t->add_option("--dtype", throughput.dtype, "float32 or bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  t->add_option("--cut", throughput.cut_layer, "the server runs layers [cut, L)")->capture_default_str();
  t->add_option("--tokens", throughput.tokens, "tokens per sample")->check(CLI::Range(1, 2048))->capture_default_str();
  t->add_option("--batches", throughput.batches, "batch sizes")->delimiter(',')->capture_default_str();
  t->add_option("--seconds", throughput.seconds, "timed seconds per batch size")->capture_default_str();
  BatchingCheck batching;
  CLI::App* b = app.add_subcommand("batching", "the server's compute stage under replaying clients, each step alone and batched");
  b->add_option("--model", batching.replay.model_dir, "model directory")->capture_default_str();
  b->add_option("--device", batching.replay.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  b->add_option("--clients", batching.clients, "client counts")->delimiter(',')->capture_default_str();
  b->add_option("--steps", batching.replay.steps, "steps per client")->check(CLI::Range(1, 100000))->capture_default_str();
  b->add_option("--batch-tokens", batching.batch_tokens, "batch_tokens of the batched rounds")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  LogitsCheck logits;
  CLI::App* l = app.add_subcommand("logits", "a model directory's logits for token ids, as raw float32 [T, V]");
  l->add_option("--model", logits.model_dir, "model directory")->required();
  l->add_option("--ids", logits.ids, "token ids")->delimiter(',')->required();
  l->add_option("--out", logits.out, "output file")->required();
  l->add_option("--adapter-out", logits.adapter_out, "add a random LoRA, write it here as a PEFT adapter, merge it");
  l->add_option("--lora-seed", logits.lora_seed, "seed of that LoRA")->capture_default_str();
  l->add_option("--adapter", logits.adapter, "load this PEFT adapter and merge it first");
  l->add_option("--greedy", logits.greedy, "also print this many greedy next tokens (KV cache)")->check(CLI::Range(0, 4096));
  TokenizeCheck tokenize;
  CLI::App* k = app.add_subcommand("tokenize", "the token ids of each text of a JSON array, by a model directory's tokenizer");
  k->add_option("--model", tokenize.model_dir, "model directory")->required();
  k->add_option("--texts", tokenize.texts, "a JSON file: an array of strings")->required();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("amaq-gpu-check"));  // stdout holds the JSON lines
  try {
    if (s->parsed()) return RunSplit(split);
    if (t->parsed()) return RunThroughput(throughput);
    if (b->parsed()) return RunBatching(batching);
    if (k->parsed()) return RunTokenize(tokenize);
    return RunLogits(logits);
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return e.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
}
