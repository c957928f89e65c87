#include "server/server_config.h"

#include <cstdint>

#include "common/model/lora_keys.h"
#include "common/base/option_keys.h"
#include "common/base/program.h"
#include "common/base/error.h"
#include "common/net/host_port.h"
#include "quant/method_keys.h"

namespace amaq::server {

namespace {

void AddAverageKeys(Config& config, const AverageOptions& defaults) {
  config.AddString("adapter_average", defaults.rule,
                   "collaborative mode's aggregate of the clients' adapters, per coordinate (server/adapter_average.h)",
                   {"mean", "trimmed_mean", "median"});
  config.AddDouble("adapter_trim", defaults.trim, "trimmed_mean: the share of uploads dropped at each end, per coordinate", 0,
                   0.49);
  config.AddDouble("adapter_norm_bound", defaults.norm_bound,
                   "scale an upload down to this many times the median upload norm (0: no bound)", 0, 1e6);
}

AverageOptions AverageFromConfig(const Config& config) {
  return {config.String("adapter_average"), config.Double("adapter_trim"), config.Double("adapter_norm_bound")};
}

// The keys that set ServerOptions fields (common/base/option_keys.h): their defaults are the struct's.
template <typename Keys>
void ServerOptionKeys(Keys& keys) {
  using O = ServerOptions;
  keys.String("model", &O::model_dir, "Hugging Face model directory (config.json, safetensors)");
  keys.Int("cut_layer", &O::cut_layer, "first layer the server runs; clients run the layers before it", 0, 1000);
  keys.String("device", &O::device, "where the server's layers run", {"auto", "cpu", "cuda"});
  keys.String("base_weights", &O::base_weights, "how the frozen base weights are held (docs/model.md); clients must match",
              {"fp32", "bf16", "nf4", "int8"});
  keys.String("compute_dtype", &O::compute_dtype,
              "dtype of the server layers' activations; LoRA stays fp32 (auto: bf16 on a GPU or a CPU with bf16 arithmetic, "
              "where it is faster at equal accuracy, fp32 elsewhere; fp32: exact against transformers; the wire stays as the "
              "method says)",
              {"auto", "fp32", "bf16"});
  keys.Group(&O::lora, AddLoraKeys, LoraFromConfig);
  keys.Double("lr", &O::lr, "AdamW learning rate of the server's LoRA", 0, 10);
  keys.Double("max_grad_norm", &O::max_grad_norm, "clip the server LoRA's gradient norm each step (0: off)", 0, 1e9);
  keys.Bool("shared_lora", &O::shared_lora, "one server LoRA for all clients instead of one per client");
  keys.String("checkpoint_dir", &O::checkpoint_dir, "directory for the server's checkpoints (empty: none)");
  keys.Int("checkpoint_every", &O::checkpoint_every, "applied training steps between checkpoints", 1, 1000000000);
  keys.Int("max_batch_tokens", &O::max_batch_tokens, "largest batch x tokens of one step", 1, 1 << 24);
  keys.Int("max_sequence_tokens", &O::max_sequence_tokens, "longest row of a step (0: the model's max_position_embeddings, never more)", 0, 1 << 24);
  keys.Int("max_step_memory_mb", &O::max_step_memory_mb,
           "most memory one step may need by the server's estimate (server/step_cost.h; 0: a quarter of the device's memory)",
           0, int64_t{1} << 40);
  keys.Int("max_client_memory_mb", &O::max_client_memory_mb,
           "most memory one client's step and the decoding cache it leaves may hold together (0: half of the device's memory)", 0,
           int64_t{1} << 40);
  keys.Double("max_steps_per_second", &O::max_steps_per_second, "per-client limit on training steps per second (0: none)", 0, 1e6);
  keys.Group(&O::method_settings, quant::AddServerMethodKeys, quant::ServerMethodSettingsFrom);
  keys.Double("session_ttl_seconds", &O::session_ttl_seconds,
              "evict a session idle this long (no stream, no call) to checkpoint_dir/sessions; its client's Join resumes it "
              "(0: never)",
              0, 1e9);
  keys.Double("max_sessions_memory_mb", &O::max_sessions_memory_mb,
              "all sessions' state together (decoding caches, AQ-SGD caches in memory, stored replies, per-client LoRA); "
              "past it the least recently seen sessions move to checkpoint_dir/sessions, or steps are refused (0: no bound)",
              0, 1e9);
  keys.Group(&O::averaging, AddAverageKeys, AverageFromConfig);
  keys.Int("seed", &O::seed, "seed of the LoRA initialisation (clients use the same)", 0, INT64_MAX);
}

void AddBatchKeys(Config& config, const BatchOptions& defaults) {
  config.AddInt("batch_tokens", defaults.max_tokens,
                "most rows x tokens of one batch of several clients' training steps (0: each step alone; -1: " +
                    std::to_string(BatchOptions::kGpuBatchTokens) + " on a GPU, 0 on a CPU)",
                -1, 1 << 24);
  config.AddDouble("batch_wait_ms", defaults.wait_ms, "how long to wait for more clients' steps to batch (0: take what is queued)",
                   0, 1000);
}

BatchOptions BatchFromConfig(const Config& config) { return {config.Int("batch_tokens"), config.Double("batch_wait_ms")}; }

// The keys that set ServiceOptions fields.
template <typename Keys>
void ServiceOptionKeys(Keys& keys) {
  using O = ServiceOptions;
  keys.Int("max_chunk_bytes", &O::max_chunk_bytes, "largest tensor chunk per gRPC message", 1024, 64 << 20);
  keys.Double("stall_timeout_seconds", &O::stall_timeout_seconds, "end a client's stream stuck this long in the middle of a step", 0.1, 1e6);
  keys.Double("connection_idle_seconds", &O::connection_idle_seconds,
              "close a connection that has had no call in flight this long (its client reconnects when it calls again)", 1, 1e6);
  keys.Group(&O::batching, AddBatchKeys, BatchFromConfig);
}

// The keys of a replica set (server/replica_group.h), defaults the struct's.
template <typename Keys>
void ReplicaOptionKeys(Keys& keys) {
  using O = ReplicaOptions;
  keys.Int("replicas", &O::replicas,
           "servers that serve this run together, each on its own host, as one replica set on c10d (docs/deploy.md, "
           "\"More than one GPU host\"); 1: this server alone", 1, 64);
  keys.Int("replica_rank", &O::rank, "this server's number in the replica set, 0..replicas-1 (rank 0 hosts the rendezvous)", 0, 63);
  keys.String("rendezvous", &O::rendezvous,
              "host:port of the replicas' meeting point, a c10d TCPStore that rank 0 keeps (rank 0 listens on the port)");
  keys.String("public_address", &O::public_address,
              "host:port at which clients and the other replicas reach this server (its host must be one of this host's addresses)");
  keys.Double("replica_timeout_seconds", &O::timeout_seconds,
              "how long a replica waits for the others to form the set, and for one average of the shared LoRA", 1, 86400);
}

}  // namespace

Config ServerConfig() {
  Config c("amaq-server");
  c.AddString("listen", "0.0.0.0:50051", "address and port to serve gRPC on (port 0: any free port)");
  c.AddInt("max_connections", 1024,
           "client connections open at once (capped by the open-files limit); a newcomer closes the oldest idle one (no "
           "TLS greeting finished within 1 s, or no authenticated call within unauthenticated_seconds), else it is closed",
           8, 1 << 20);
  c.AddInt("max_connections_per_address", 64,
           "client connections open at once from one IP address; a newcomer over it closes that address's oldest idle one, "
           "else it is closed", 1, 1 << 20);
  c.AddDouble("unauthenticated_seconds", 10,
              "a connection that has made no call with a valid token this long after it was accepted counts as idle: a "
              "newcomer over a connection limit may close it (a client certificate alone is not a token; 0: never idle "
              "once its TLS greeting finished)",
              0, 86400);
  c.AddDouble("connections_per_second_per_address", 64,
              "new client connections one IP address may open a second, after a burst of twice as many; more are closed "
              "before their TLS handshake (a handshake flood or reconnecting resets spend their own address's budget; 0: "
              "no bound)",
              0, 1e6);
  c.AddInt("front_door_threads", 0,
           "threads that end the clients' TLS and carry their bytes to gRPC (the front door; each connection stays on one; "
           "0: a quarter of the cores, 1 to 8): more keep handshakes flowing when many clients, or a handshake flood, "
           "arrive, and leave fewer cores to gRPC and the model",
           0, 64);
  c.AddDouble("stream_frames_per_second", 20,
              "HTTP/2 streams one client connection may open or reset a second after a burst of stream_frame_burst (HEADERS "
              "and RST_STREAM frames, counted by the front door); a connection over it is closed (rapid reset; 0: not counted)",
              0, 1e6);
  c.AddInt("stream_frame_burst", 100, "HTTP/2 streams one client connection may open or reset at once (stream_frames_per_second)",
           1, 1 << 20);
  c.AddString("port_file", "", "write the port actually bound to this file (for scripts using port 0)");
  DeclareOptionKeys<ServerOptions>(c, [](auto& keys) { ServerOptionKeys(keys); });
  DeclareOptionKeys<ReplicaOptions>(c, [](auto& keys) { ReplicaOptionKeys(keys); });
  c.AddDouble("replica_sync_seconds", 10,
              "with shared_lora and replicas > 1: how often the replicas replace the shared LoRA by its mean over them", 0.01, 86400);
  c.AddString("tls_cert", "", "server certificate chain (PEM)");
  c.AddString("tls_key", "", "server private key (PEM)");
  c.AddString("tls_client_ca", "", "CA of client certificates: set it to require mutual TLS");
  c.AddBool("insecure", false, "plain-text gRPC: for tests on loopback only");
  c.AddString("tokens_file", "", "file of \"client_id token\" lines; empty accepts any client (tests only)");
  DeclareOptionKeys<ServiceOptions>(c, [](auto& keys) { ServiceOptionKeys(keys); });
  c.AddString("metrics_listen", "",
              "address:port of the HTTP endpoint: Prometheus /metrics and the live view / (empty: off); a bare port means 127.0.0.1:port");
  c.AddString("metrics_token_file", "", "file holding the bearer token /metrics, the live view's data and /api/status require");
  c.AddBool("metrics_tls", false,
            "serve metrics_listen over HTTPS with the server's tls_cert and tls_key, so that tokens and pages do not cross the network in the clear");
  c.AddBool("metrics_public", false,
            "without metrics_token_file, serve /metrics and the live view to anyone who reaches metrics_listen (false: only /healthz and /readyz)");
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  AddProgramKeys(c);
  return c;
}

ServerOptions ServerOptionsFrom(const Config& c) {
  return OptionsFrom<ServerOptions>(c, [](auto& keys) { ServerOptionKeys(keys); });
}

ReplicaOptions ReplicaOptionsFrom(const Config& c) {
  return OptionsFrom<ReplicaOptions>(c, [](auto& keys) { ReplicaOptionKeys(keys); });
}

ServiceOptions ServiceOptionsFrom(const Config& c) {
  return OptionsFrom<ServiceOptions>(c, [](auto& keys) { ServiceOptionKeys(keys); });
}

void CheckServerConfig(const Config& c) {
  ServerOptionsFrom(c);
  ServiceOptionsFrom(c);
  SplitHostPort(c.String("listen"), "listen");
  const ReplicaOptions replicas = ReplicaOptionsFrom(c);
  if (replicas.replicas > 1) {
    Require(replicas.rank < replicas.replicas, ErrorCode::kInvalidArgument,
            "replica_rank must be below replicas (" + std::to_string(replicas.replicas) + "), got " +
                std::to_string(replicas.rank) + ": number the replicas from 0");
    SplitHostPort(replicas.rendezvous, "rendezvous");
    SplitHostPort(replicas.public_address, "public_address");
  }
  const std::string metrics = c.String("metrics_listen");
  if (!metrics.empty() && metrics.find(':') != std::string::npos) SplitHostPort(metrics, "metrics_listen");
}

}  // namespace amaq::server
