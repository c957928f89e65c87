// The model on this machine: forward+backward tokens/s of the base model (full training and LoRA
// fine-tuning) at 1 and 2 threads, and the peak memory of a process holding the client part
// (embedding + layers [0, cut)) against one holding the whole model, each measured in a fresh
// child process (getrusage peak RSS), running one LoRA step.
//   bench_model [MODEL_DIR] [CUT]     (defaults: models/amaq-base 2)
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/threads.h"

using namespace amaq;

namespace {

double TokensPerSecond(const ModelConfig& c, const std::string& dir, bool lora, int threads) {
  SetComputeThreads(threads);
  ModelPart model(c, PartSpec::Whole(c));
  LoadPartWeights(model, dir);
  if (lora) model->AddLora(LoraConfig{});  // the programs' adapter: rank 16 on every projection
  const int64_t batch = 16, tokens = 64;
  const torch::Tensor ids = torch::randint(c.vocab_size, {batch, tokens}, torch::kLong);
  const torch::Tensor mask = torch::ones({batch, tokens}, torch::kLong);
  const auto step = [&] { NextTokenLoss(model->LogitsAtLabels(ids, mask, ids), ids).backward(); };
  for (int i = 0; i < 3; ++i) step();
  const int steps = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(steps * batch * tokens) / seconds;
}

// Peak RSS (MiB) of a child that loads `spec` and runs one LoRA step on it.
double PeakMiB(const ModelConfig& c, const std::string& dir, PartSpec spec) {
  int pipe_fd[2];
  if (pipe(pipe_fd) != 0) return -1;
  std::fflush(stdout);  // the child must not print the parent's buffered lines again
  const pid_t pid = fork();
  if (pid == 0) {
    SetComputeThreads(1);
    ModelPart part(c, spec);
    LoadPartWeights(part, dir);
    part->AddLora(LoraConfig{});
    const int64_t batch = 16, tokens = 64;
    const torch::Tensor mask = torch::ones({batch, tokens}, torch::kLong);
    const torch::Tensor out = spec.embed ? part(torch::randint(c.vocab_size, {batch, tokens}, torch::kLong), mask)
                                         : part(torch::randn({batch, tokens, c.hidden_size}), mask);
    out.sum().backward();
    int64_t parameter_bytes = 0;
    for (const auto& p : part->parameters()) parameter_bytes += p.numel() * p.element_size();
    std::printf("  (%s: %.1f MiB of parameters)\n", spec.embed && spec.head ? "whole" : spec.embed ? "client" : "server",
                static_cast<double>(parameter_bytes) / (1 << 20));
    std::fflush(stdout);
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    const double mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
    if (write(pipe_fd[1], &mib, sizeof mib) != sizeof mib) _exit(1);
    _exit(0);
  }
  double mib = -1;
  close(pipe_fd[1]);
  if (read(pipe_fd[0], &mib, sizeof mib) != sizeof mib) mib = -1;
  close(pipe_fd[0]);
  waitpid(pid, nullptr, 0);
  return mib;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "models/amaq-base";
  const int64_t cut = argc > 2 ? std::stoll(argv[2]) : 2;
  const ModelConfig c = ModelConfig::Load(dir + "/config.json");
  std::printf("model %s: %lld layers, hidden %lld, vocab %lld; batch 16 x 64 tokens\n", dir.c_str(),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size));
  for (bool lora : {false, true}) {
    for (int threads : {1, 2}) {
      std::printf("forward+backward, %s, %d thread(s): %.0f tokens/s\n", lora ? "LoRA fine-tuning" : "full training",
                  threads, TokensPerSecond(c, dir, lora, threads));
    }
  }
  std::printf("peak memory, client part (embedding + layers [0, %lld)): %.0f MiB\n", static_cast<long long>(cut),
              PeakMiB(c, dir, PartSpec::Client(cut)));
  std::printf("peak memory, server part (layers [%lld, %lld) + head): %.0f MiB\n", static_cast<long long>(cut),
              static_cast<long long>(c.num_hidden_layers), PeakMiB(c, dir, PartSpec::Server(c, cut)));
  std::printf("peak memory, whole model: %.0f MiB\n", PeakMiB(c, dir, PartSpec::Whole(c)));
  return 0;
}
