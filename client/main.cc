// amaq-client: trains the first layers of a model on this device's private data, with the rest on
// an amaq-server, compressing what crosses the cut with the chosen method. Settings: --config
// client.yaml and/or --key value flags (docs/configuration.md). Prints one summary line at the end.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <fstream>
#include <thread>

#include "client/grpc_transport.h"
#include "client/client_config.h"
#include "client/split_client.h"
#include "common/config.h"
#include "common/datasets.h"
#include "common/error.h"
#include "common/lora_keys.h"
#include "common/program.h"
#include "common/threads.h"

using namespace amaq;

namespace {

Dataset LoadTask(const Config& c) {
  const std::string task = c.String("task");
  Dataset all = task == "wordnet" ? LoadWordNetTopics(c.String("data"))
              : task == "verbs"   ? LoadVerbPastTense(c.String("data"))
              : task == "arithmetic" ? MakeArithmetic(3, 20000, 500, 500, 7)
              : LoadJsonl(c.String("train_jsonl"), c.String("validation_jsonl"), "");
  Dataset mine = all;
  mine.train.clear();
  const auto shard = static_cast<size_t>(c.Int("shard_index")), shards = static_cast<size_t>(c.Int("shard_count"));
  Require(shard < shards, ErrorCode::kInvalidArgument, "shard_index must be below shard_count");
  for (size_t i = 0; i < all.train.size(); ++i) {
    if (i % shards == shard) mine.train.push_back(all.train[i]);
  }
  const auto cap = static_cast<size_t>(c.Int("max_train_examples"));
  if (cap > 0 && mine.train.size() > cap) mine.train.resize(cap);
  return mine;
}

std::string ReadToken(const Config& c) {
  if (c.String("token_file").empty()) return c.String("token");
  std::ifstream in(c.String("token_file"));
  Require(in.good(), ErrorCode::kNotFound, c.String("token_file") + ": token file not found");
  std::string token;
  in >> token;
  return token;
}

int Run(const Config& c) {
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  client::GrpcOptions g;
  g.server = c.String("server");
  g.tls = TlsFiles{c.String("tls_cert"), c.String("tls_key"), c.String("tls_ca")};
  g.insecure = c.Bool("insecure");
  g.server_name = c.String("tls_server_name");
  g.token = ReadToken(c);
  g.meter = c.Bool("meter");
  g.call_timeout_seconds = c.Double("call_timeout_seconds");
  client::GrpcTransport transport(g);

  client::ClientOptions o;
  o.client_id = c.String("client_id");
  o.model_dir = c.String("model");
  o.cut_layer = c.Int("cut_layer");
  o.method = c.String("method");
  o.lora = LoraFromConfig(c);
  o.lr = c.Double("lr");
  o.max_grad_norm = c.Double("max_grad_norm");
  o.steps = c.Int("steps");
  o.batch = c.Int("batch");
  o.max_tokens = c.Int("max_tokens");
  o.seed = static_cast<uint64_t>(c.Int("seed"));
  o.eval_every = c.Int("eval_every");
  o.eval_examples = c.Int("eval_examples");
  o.eval_batch = c.Int("eval_batch");
  o.amaq_alpha = c.Double("amaq_alpha");
  o.amaq_beta = c.Double("amaq_beta");
  o.amaq_gate_lr = c.Double("amaq_gate_lr");
  o.amaq_warmup = c.Int("amaq_warmup");
  o.aqsgd_cache_bytes = static_cast<uint64_t>(c.Int("aqsgd_cache_mb")) << 20;
  o.aqsgd_spill_dir = c.String("aqsgd_spill_dir");
  o.csv_path = c.String("csv");
  o.checkpoint_dir = c.String("checkpoint_dir");
  o.checkpoint_every = c.Int("checkpoint_every");
  o.adapter_out = c.String("adapter_out");
  o.sync_every = c.Int("sync_every");
  o.retry_seconds = c.Double("retry_seconds");
  o.progress = c.Bool("progress");
  client::SplitClient split(o, LoadTask(c), transport);
  const double metric = split.Run();
  std::printf("client %s  method %s  steps %lld  metric %.4f  up %.3f MB  down %.3f MB  average bits %.2f\n",
              o.client_id.c_str(), o.method.c_str(), static_cast<long long>(o.steps), metric,
              static_cast<double>(transport.bytes_up()) / 1e6, static_cast<double>(transport.bytes_down()) / 1e6,
              split.average_bits());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config = client::ClientConfig();
  return RunProgram(config, argc, argv, Run);
}
