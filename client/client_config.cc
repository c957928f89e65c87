#include "client/client_config.h"

#include <cstdint>

#include "common/error.h"
#include "common/lora_keys.h"

namespace amaq::client {

Config ClientConfig() {
  Config c("amaq-client");
  c.AddString("server", "localhost:50051", "amaq-server address (host:port)");
  c.AddString("client_id", "client-0", "this client's name (must match its token)");
  c.AddString("token", "", "bearer token (prefer token_file)");
  c.AddString("token_file", "", "file holding the bearer token");
  c.AddString("tls_ca", "", "CA that signed the server's certificate (PEM)");
  c.AddString("tls_cert", "", "client certificate for mutual TLS (PEM, optional)");
  c.AddString("tls_key", "", "client private key for mutual TLS (PEM, optional)");
  c.AddString("tls_server_name", "", "name to verify in the server's certificate (default: the host in server)");
  c.AddBool("insecure", false, "plain-text gRPC: for tests on loopback only");
  c.AddBool("meter", true, "count bytes at the socket through a local relay");
  c.AddString("model", "models/amaq-base", "Hugging Face model directory (the same base model as the server)");
  c.AddInt("cut_layer", 2, "layers [0, cut) run here", 0, 1000);
  c.AddString("method", "amaq:8->3", "fp32 | bf16 | fp16 | fixed:<b>[:<granularity>[:<G>]] | amaq[:<bmax>-><bmin>] | amaq:budget=<b>[:uniform] | aqsgd:<b>; a quantized one may end in :grad=<b>");
  c.AddString("task", "wordnet", "data set", {"wordnet", "verbs", "arithmetic", "jsonl"});
  c.AddString("data", "data", "data directory (scripts/fetch-data)");
  c.AddString("train_jsonl", "", "task jsonl: training file");
  c.AddString("validation_jsonl", "", "task jsonl: validation file");
  c.AddInt("shard_index", 0, "this client's share of the training data: examples i with i % shard_count == shard_index", 0, 1 << 20);
  c.AddInt("shard_count", 1, "number of shares", 1, 1 << 20);
  c.AddInt("max_train_examples", 0, "cap on this client's training examples (0: all)", 0, INT64_MAX);
  c.AddInt("steps", 200, "training steps", 0, INT64_MAX);
  c.AddInt("batch", 16, "sequences per step", 1, 1 << 20);
  c.AddInt("max_tokens", 64, "longest sequence (prompt cut from the left)", 4, 1 << 20);
  AddLoraKeys(c);
  c.AddDouble("lr", 2e-3, "AdamW learning rate of the client's LoRA", 0, 10);
  c.AddDouble("max_grad_norm", 0, "clip the client LoRA's gradient norm each step (0: off)", 0, 1e9);
  c.AddInt("seed", 1, "seed of the data order and the LoRA initialisation (the server's must match)", 0, INT64_MAX);
  c.AddInt("eval_every", 0, "steps between evaluations (0: only at the end)", 0, INT64_MAX);
  c.AddInt("eval_examples", 200, "validation examples per evaluation", 1, INT64_MAX);
  c.AddInt("eval_batch", 32, "sequences per evaluation request", 1, 1 << 20);
  c.AddDouble("amaq_alpha", 1.0, "AMAQ gate sharpness alpha", 1e-6, 1e6);
  c.AddDouble("amaq_beta", 0.01, "AMAQ bit-regularizer weight beta", 0, 1e6);
  c.AddDouble("amaq_gate_lr", 0.05, "AMAQ gates' Adam learning rate", 1e-9, 100);
  c.AddInt("amaq_warmup", 0, "AMAQ steps at bmax before the regularizer (or the budget's descent) starts", 0, INT64_MAX);
  c.AddDouble("amaq_ramp_fraction", 0.5, "AMAQ budget: share of the steps after the warm-up spent descending to the target", 0.01, 1);
  c.AddInt("aqsgd_cache_mb", 1024, "memory of the AQ-SGD cache before spilling", 1, 1 << 20);
  c.AddString("aqsgd_spill_dir", "", "where the AQ-SGD cache spills (empty: the memory limit is hard)");
  c.AddString("csv", "", "per-step CSV of this run (empty: none)");
  c.AddString("checkpoint_dir", "", "directory for this client's checkpoints (empty: none)");
  c.AddInt("checkpoint_every", 50, "steps between checkpoints", 1, INT64_MAX);
  c.AddInt("sync_every", 0, "collaborative mode: average the clients' adapters every N steps (0: off)", 0, INT64_MAX);
  c.AddString("adapter_out", "", "export the client's LoRA here in PEFT format at the end (empty: no)");
  c.AddDouble("call_timeout_seconds", 60, "give up on one call or step after this long and retry it (a stalled link)", 0.1, 1e6);
  c.AddDouble("retry_seconds", 120, "how long to keep reconnecting to a lost server", 0, 1e9);
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  c.AddBool("progress", true, "progress bar on a terminal, log lines otherwise");
  c.AddString("log_level", "info", "spdlog level", {"trace", "debug", "info", "warn", "error"});
  return c;
}

ClientOptions ClientOptionsFrom(const Config& c) {
  ClientOptions o;
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
  o.amaq_ramp_fraction = c.Double("amaq_ramp_fraction");
  o.aqsgd_cache_bytes = static_cast<uint64_t>(c.Int("aqsgd_cache_mb")) << 20;
  o.aqsgd_spill_dir = c.String("aqsgd_spill_dir");
  o.csv_path = c.String("csv");
  o.checkpoint_dir = c.String("checkpoint_dir");
  o.checkpoint_every = c.Int("checkpoint_every");
  o.adapter_out = c.String("adapter_out");
  o.sync_every = c.Int("sync_every");
  o.retry_seconds = c.Double("retry_seconds");
  o.progress = c.Bool("progress");
  return o;
}

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

}  // namespace amaq::client
