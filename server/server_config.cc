#include "server/server_config.h"

#include <cstdint>

#include "common/lora_keys.h"

namespace amaq::server {

Config ServerConfig() {
  Config c("amaq-server");
  c.AddString("listen", "0.0.0.0:50051", "address and port to serve gRPC on (port 0: any free port)");
  c.AddInt("max_connections", 1024, "client connections open at once (capped by the open-files limit); more are closed", 8,
           1 << 20);
  c.AddString("port_file", "", "write the port actually bound to this file (for scripts using port 0)");
  c.AddString("model", "models/amaq-base", "Hugging Face model directory (config.json, safetensors)");
  c.AddInt("cut_layer", 2, "first layer the server runs; clients run the layers before it", 0, 1000);
  c.AddString("device", "auto", "where the server's layers run", {"auto", "cpu", "cuda"});
  AddLoraKeys(c);
  c.AddDouble("lr", 2e-3, "AdamW learning rate of the server's LoRA", 0, 10);
  c.AddDouble("max_grad_norm", 0, "clip the server LoRA's gradient norm each step (0: off)", 0, 1e9);
  c.AddBool("shared_lora", false, "one server LoRA for all clients instead of one per client");
  c.AddString("checkpoint_dir", "", "directory for the server's checkpoints (empty: none)");
  c.AddInt("checkpoint_every", 100, "applied training steps between checkpoints", 1, 1000000000);
  c.AddString("tls_cert", "", "server certificate chain (PEM)");
  c.AddString("tls_key", "", "server private key (PEM)");
  c.AddString("tls_client_ca", "", "CA of client certificates: set it to require mutual TLS");
  c.AddBool("insecure", false, "plain-text gRPC: for tests on loopback only");
  c.AddString("tokens_file", "", "file of \"client_id token\" lines; empty accepts any client (tests only)");
  c.AddInt("max_chunk_bytes", 1 << 20, "largest tensor chunk per gRPC message", 1024, 64 << 20);
  c.AddDouble("stall_timeout_seconds", 30, "end a client's stream stuck this long in the middle of a step", 0.1, 1e6);
  c.AddInt("max_batch_tokens", 65536, "largest batch x tokens of one step", 1, 1 << 24);
  c.AddInt("max_sequence_tokens", 0, "longest row of a step (0: the model's max_position_embeddings, never more)", 0, 1 << 24);
  c.AddDouble("max_steps_per_second", 0, "per-client limit on training steps per second (0: none)", 0, 1e6);
  c.AddString("metrics_listen", "",
              "address:port of the Prometheus /metrics endpoint, or a port for 127.0.0.1:port (empty: off)");
  c.AddString("metrics_token_file", "", "file holding the bearer token /metrics requires (empty: none; then bind to 127.0.0.1)");
  c.AddInt("aqsgd_cache_mb", 1024, "memory of each client's AQ-SGD cache before spilling", 1, 1 << 20);
  c.AddString("aqsgd_spill_dir", "", "where AQ-SGD caches spill (empty: the memory limit is hard)");
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  c.AddInt("seed", 1, "seed of the LoRA initialisation (clients use the same)", 0, INT64_MAX);
  c.AddString("log_level", "info", "spdlog level", {"trace", "debug", "info", "warn", "error"});
  return c;
}

}  // namespace amaq::server
