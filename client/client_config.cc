#include "client/client_config.h"

#include <cstdint>
#include <fstream>

#include <spdlog/spdlog.h>

#include "common/base/error.h"
#include "common/model/lora_keys.h"
#include "common/base/option_keys.h"
#include "common/base/program.h"
#include "common/base/split_step.h"
#include "common/net/host_port.h"
#include "common/text/user_data.h"
#include "quant/method.h"
#include "quant/method_keys.h"

namespace amaq::client {

namespace {

void AddMicroBatchesKey(Config& c, const int64_t& fallback) {
  c.AddString("micro_batches", fallback == MicroBatchChoice::kAuto ? "auto" : std::to_string(fallback),
              "send each step in this many parts of its rows (1 to " + std::to_string(kMaxMicroBatches) +
                  "), each sent as soon as it is computed, so that transfers overlap compute; the server adds their "
                  "gradients up and applies the step once. auto: 1 in one process; over a network the count (1, 2, 4 "
                  "or 8) whose first steps took least time, measured again after a reconnection; a run that must repeat "
                  "bit for bit names a count. Whole steps where the server trains one shared LoRA (docs/protocol.md)");
}

int64_t MicroBatchesFrom(const Config& c) { return ParseMicroBatches(c.String("micro_batches")); }

// The keys that set ClientOptions fields (common/base/option_keys.h): their defaults are the struct's.
template <typename Keys>
void ClientOptionKeys(Keys& keys) {
  using O = ClientOptions;
  keys.String("client_id", &O::client_id, "this client's name (must match its token)");
  keys.String("model", &O::model_dir, "Hugging Face model directory (the same base model as the server)");
  keys.Int("cut_layer", &O::cut_layer, "layers [0, cut) run here", 0, 1000);
  keys.String("method", &O::method, quant::MethodGrammar());
  keys.String("base_weights", &O::base_weights, "how the frozen base weights are held (docs/model.md); the server's must match",
              {"fp32", "bf16", "nf4", "int8"});
  keys.Bool("recompute_layers", &O::recompute_layers, "recompute the client layers' activations in backward: less memory, one more forward");
  keys.String("compute_dtype", &O::compute_dtype,
              "dtype of the client layers' activations; LoRA stays fp32 (auto: bf16 on a CPU with bf16 arithmetic, where it "
              "is faster at equal accuracy, fp32 elsewhere; bf16 with nf4: QLoRA's recipe, about half the activation memory)",
              {"auto", "fp32", "bf16"});
  keys.Int("steps", &O::steps, "training steps", 0, INT64_MAX);
  keys.Int("batch", &O::batch, "sequences per step", 1, 1 << 20);
  keys.Group(&O::micro_batches, AddMicroBatchesKey, MicroBatchesFrom);
  keys.Bool("one_step_stale", &O::one_step_stale, "begin each step while the previous one is in flight (PipeDream-style weight stashing): its forward and gradient use the client's weights from before the previous step's update; faster on slow links, not the serial step's result (docs/protocol.md)");
  keys.Int("max_tokens", &O::max_tokens, "longest sequence (prompt cut from the left)", 4, 1 << 20);
  keys.Group(&O::lora, AddLoraKeys, LoraFromConfig);
  keys.Double("lr", &O::lr, "AdamW learning rate of the client's LoRA", 0, 10);
  keys.Double("max_grad_norm", &O::max_grad_norm, "clip the client LoRA's gradient norm each step (0: off)", 0, 1e9);
  keys.Int("seed", &O::seed, "seed of the data order and the LoRA initialisation (the server's must match)", 0, INT64_MAX);
  keys.Int("eval_every", &O::eval_every, "steps between evaluations (0: only at the end)", 0, INT64_MAX);
  keys.Int("eval_examples", &O::eval_examples, "validation examples per evaluation", 1, INT64_MAX);
  keys.Int("eval_batch", &O::eval_batch, "sequences per evaluation request", 1, 1 << 20);
  keys.Group(&O::method_settings, quant::AddClientMethodKeys, quant::ClientMethodSettingsFrom);
  keys.String("csv", &O::csv_path, "per-step CSV (empty: none), appended to: its step column counts steps done, an evaluation repeats its step's row with the metric, its run column (the UTC time of the run's first step) tells apart the runs written to one file (scripts/report shows the last), and its server column names the server that answered each row (in a replica set, the replica that served it)");
  keys.String("predictions", &O::predictions_path, "CSV of the final evaluation's answers, one line per example: example, expected, predicted, correct (empty: none)");
  keys.String("checkpoint_dir", &O::checkpoint_dir, "directory for this client's checkpoints (empty: none)");
  keys.Int("checkpoint_every", &O::checkpoint_every, "steps between checkpoints; above 2, a client killed between two of them is refused on restart unless accept_divergence (docs/reliability.md)", 1, INT64_MAX);
  keys.Int("history_every", &O::history_every, "steps between writes of the method's history (AQ-SGD's cache of activations; any age is safe: older entries go in full)", 1, INT64_MAX);
  keys.Bool("accept_divergence", &O::accept_divergence, "continue although the server applied steps beyond this client's checkpoint whose answers it no longer keeps: the client's layers then train on answers from newer server layers (docs/reliability.md)");
  keys.Int("sync_every", &O::sync_every, "collaborative mode: average the clients' adapters every N steps (0: off)", 0, INT64_MAX);
  keys.String("adapter_out", &O::adapter_out, "export the whole fine-tune here at the end as one PEFT adapter: this client's LoRA and the server's (empty: no)");
  keys.String("merged_out", &O::merged_out, "also write the base model with that adapter merged in here, a Hugging Face model directory (empty: no; needs adapter_out)");
  keys.String("special_tokens", &O::special_tokens, "special tokens in the data's text: parse (become their ids, as Hugging Face does) or plain (stay text)",
              {"parse", "plain"});
  keys.Double("retry_seconds", &O::retry_seconds, "how long to keep reconnecting to a lost server", 0, 1e9);
  keys.Bool("progress", &O::progress, "progress bar on a terminal, log lines otherwise");
  keys.Bool("resume", &O::resume, "continue the run the server and checkpoint_dir hold for this client_id although its settings differ (docs/protocol.md, Runs)");
  keys.Bool("fresh", &O::fresh, "discard what the server and checkpoint_dir hold for this client_id and start at step 0 (each time the client starts with it)");
}

void AddTlsKeys(Config& c, const TlsFiles&) {
  c.AddString("tls_ca", "", "CA that signed the server's certificate (PEM)");
  c.AddString("tls_cert", "", "client certificate for mutual TLS (PEM, optional)");
  c.AddString("tls_key", "", "client private key for mutual TLS (PEM, optional)");
}

TlsFiles TlsFrom(const Config& c) { return TlsFiles{c.String("tls_cert"), c.String("tls_key"), c.String("tls_ca")}; }

void AddTokenKeys(Config& c, const std::string&) {
  c.AddString("token", "", "bearer token (prefer token_file)");
  c.AddString("token_file", "", "file holding the bearer token");
}

std::string TokenFrom(const Config& c) {
  if (c.String("token_file").empty()) return c.String("token");
  std::ifstream in(c.String("token_file"));
  Require(in.good(), ErrorCode::kNotFound, c.String("token_file") + ": token file not found: give the path of the file "
                                                                    "holding this client's token");
  std::string token;
  in >> token;
  return token;
}

// The keys that set GrpcOptions fields.
template <typename Keys>
void GrpcOptionKeys(Keys& keys) {
  using O = GrpcOptions;
  keys.String("server", &O::server, "amaq-server address (host:port)");
  keys.Group(&O::token, AddTokenKeys, TokenFrom);
  keys.Group(&O::tls, AddTlsKeys, TlsFrom);
  keys.String("tls_server_name", &O::server_name, "name to verify in the server's certificate (default: the host in server)");
  keys.Bool("insecure", &O::insecure, "plain-text gRPC: for tests on loopback only");
  keys.Bool("meter", &O::meter, "count bytes at the socket through a local relay");
  keys.Double("call_timeout_seconds", &O::call_timeout_seconds, "give up on one call or step after this long and retry it (a stalled link)", 0.1, 1e6);
}

}  // namespace

Config ClientConfig(const std::string& program) {
  Config c(program);
  DeclareOptionKeys<GrpcOptions>(c, [](auto& keys) { GrpcOptionKeys(keys); });
  DeclareOptionKeys<ClientOptions>(c, [](auto& keys) { ClientOptionKeys(keys); });
  c.AddString("task", "wordnet", "data set (file: your own, docs/data.md)", {"wordnet", "verbs", "arithmetic", "file"});
  c.AddString("data", "data", "data directory (scripts/fetch-data)");
  c.AddString("train_file", "", "task file: training examples, a .jsonl or .csv file (docs/data.md)");
  c.AddString("validation_file", "", "task file: validation examples, a .jsonl or .csv file (the metric is measured on them)");
  c.AddInt("shard_index", 0, "this client's share of the training data: examples i with i % shard_count == shard_index", 0, 1 << 20);
  c.AddInt("shard_count", 1, "number of shares", 1, 1 << 20);
  c.AddInt("max_train_examples", 0, "cap on this client's training examples (0: all)", 0, INT64_MAX);
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  AddProgramKeys(c);
  return c;
}

ClientOptions ClientOptionsFrom(const Config& c) {
  return OptionsFrom<ClientOptions>(c, [](auto& keys) { ClientOptionKeys(keys); });
}

GrpcOptions GrpcOptionsFrom(const Config& c) {
  return OptionsFrom<GrpcOptions>(c, [](auto& keys) { GrpcOptionKeys(keys); });
}

void CheckClientConfig(const Config& c) {
  quant::Method::Parse(ClientOptionsFrom(c).method);
  SplitHostPort(c.String("server"), "server");
  if (c.String("task") == "file") RequireUserDataFiles(c.String("train_file"), c.String("validation_file"));
}

Dataset LoadTask(const Config& c) {
  const std::string task = c.String("task");
  Dataset all = task == "wordnet" ? LoadWordNetTopics(c.String("data"))
              : task == "verbs"   ? LoadVerbPastTense(c.String("data"))
              : task == "arithmetic" ? MakeArithmetic(3, 20000, 500, 500, 7)
              : LoadUserData(c.String("train_file"), c.String("validation_file"));
  Dataset mine = all;
  mine.train.clear();
  const auto shard = static_cast<size_t>(c.Int("shard_index")), shards = static_cast<size_t>(c.Int("shard_count"));
  Require(shard < shards, ErrorCode::kInvalidArgument, "shard_index must be below shard_count");
  for (size_t i = 0; i < all.train.size(); ++i) {
    if (i % shards == shard) mine.train.push_back(all.train[i]);
  }
  Require(!mine.train.empty(), ErrorCode::kInvalidArgument,
          "share " + std::to_string(shard) + " of " + std::to_string(shards) + " of the " + all.name +
              " training examples is empty (" + std::to_string(all.train.size()) + " examples): use a smaller shard_count");
  const auto cap = static_cast<size_t>(c.Int("max_train_examples"));
  if (cap > 0 && mine.train.size() > cap) mine.train.resize(cap);
  std::string labels;
  for (size_t i = 0; i < mine.labels.size() && i < 10; ++i) labels += (i ? ", " : "") + mine.labels[i];
  if (mine.labels.size() > 10) labels += ", ...";
  spdlog::info("{}: {} training examples (this client's share of {}), {} validation examples; {}", all.name,
               mine.train.size(), all.train.size(), mine.validation.size(),
               mine.is_classification() ? std::to_string(mine.labels.size()) + " labels: " + labels : "generation (prompt, completion)");
  return mine;
}

}  // namespace amaq::client
