// A client part's memory and LoRA step speed by how its base weights are held (docs/model.md):
// fp32, bf16, int8, nf4 and nf4 with recomputed layers, computing in fp32, and fp32, bf16 and nf4
// computing in bf16 (nf4: QLoRA's recipe), on a model where the weights, not LibTorch's
// libraries, dominate. It writes a random LLaMA model with TinyLlama-1.1B's shapes (hidden 2048,
// MLP 5632, 32 heads, 4 key/value heads, vocabulary 32000, tied embedding; CUT + 1 layers) with
// the project's checkpoint writer into a temporary folder, removed at the end. Each configuration runs in a fresh child process:
// RSS once LibTorch has run an operation (the libraries' fixed cost), then the client part
// [0, CUT) is built and loaded, and STEPS LoRA steps run (forward, backward of a random gradient
// at the cut, AdamW); the peak is the process's high-water RSS (VmHWM).
// Children return large frees to the system as amaq-client does when asked to save memory
// (common/base/memory.h: any base_weights but fp32, or recomputation); fp32 weights run both ways,
// computing in fp32 or in bf16 (which returned them until 2026-12-07).
// Only the parent forks, and it never runs LibTorch itself.
// With MODEL_DIR, the client part of that model instead (e.g. models/smollm2-135m-instruct);
// THREADS: LibTorch's compute threads in each child.
//   bench_memory [CUT] [BATCH] [TOKENS] [STEPS] [MODEL_DIR|random] [THREADS]
//   (defaults: 4 1 256 3 random 2)
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "common/base/memory.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/threads.h"

using namespace amaq;

namespace {

ModelConfig BenchConfig(int64_t layers) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = true;
  return c;
}

// A /proc/self/status field in MiB ("VmRSS", "VmHWM").
double StatusMiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return -1;
}

// Runs `body` in a child process and returns what it wrote to its pipe (one line), or "" on failure.
std::string InChild(const std::function<std::string()>& body) {
  int fd[2];
  if (pipe(fd) != 0) return "";
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    std::string out;
    try {
      out = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_memory: %s\n", e.what());
      _exit(1);
    }
    if (write(fd[1], out.data(), out.size()) != static_cast<ssize_t>(out.size())) _exit(1);
    _exit(0);
  }
  close(fd[1]);
  std::string out;
  char buffer[256];
  for (ssize_t n; (n = read(fd[0], buffer, sizeof buffer)) > 0;) out.append(buffer, static_cast<size_t>(n));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

struct Setup {
  int64_t cut, batch, tokens, steps, threads;
};

std::string Measure(const std::string& dir, const Setup& s, BaseWeights format, bool recompute, bool return_frees,
                    torch::Dtype compute) {
  if (return_frees) ReturnLargeFreesToTheSystem();
  SetComputeThreads(static_cast<int>(s.threads));
  (torch::ones({64, 64}).matmul(torch::ones({64, 64}))).sum().item<float>();  // load and start LibTorch
  const double fixed = StatusMiB("VmRSS");
  const ModelConfig c = ModelConfig::Load(dir + "/config.json");
  ModelPart part(c, PartSpec::Client(s.cut), format);
  LoadPartWeights(part, dir);
  part->AddLora(LoraConfig{});
  part->set_recompute_layers(recompute);
  part->set_compute_dtype(compute);
  const double loaded = StatusMiB("VmRSS");
  torch::optim::AdamW optimizer(part->TrainableParameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.0));
  const torch::Tensor ids = torch::randint(c.vocab_size, {s.batch, s.tokens}, torch::kLong);
  const torch::Tensor mask = torch::ones({s.batch, s.tokens}, torch::kLong);
  const torch::Tensor upstream = torch::randn({s.batch, s.tokens, c.hidden_size}) * 1e-3;
  const auto step = [&] {
    optimizer.zero_grad();
    part(ids, mask).to(torch::kFloat).backward(upstream);
    optimizer.step();
  };
  step();  // the first step allocates the optimizer's state
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 1; i < s.steps; ++i) step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t lora_bytes = 0;
  for (const auto& p : part->TrainableParameters()) lora_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const double peak = StatusMiB("VmHWM");
  char line[512];
  std::snprintf(line, sizeof line, "| %s%s%s%s | %.0f | %.1f | %.0f | %.0f | %.0f | %.0f |\n", ToString(format).c_str(),
                recompute ? " + recompute" : "", compute == torch::kBFloat16 ? ", bf16 compute" : "",
                format == BaseWeights::kFp32 && !recompute && return_frees ? ", frees returned" : "",
                static_cast<double>(part->BaseWeightBytes()) / (1 << 20),
                static_cast<double>(lora_bytes) / (1 << 20), fixed, loaded - fixed, peak - fixed,
                static_cast<double>((s.steps - 1) * s.batch * s.tokens) / seconds);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  const Setup s{argc > 1 ? std::stoll(argv[1]) : 4, argc > 2 ? std::stoll(argv[2]) : 1,
                argc > 3 ? std::stoll(argv[3]) : 256, argc > 4 ? std::stoll(argv[4]) : 3,
                argc > 6 ? std::stoll(argv[6]) : 2};
  if (s.cut < 1 || s.batch < 1 || s.tokens < 1 || s.steps < 2 || s.threads < 1) {
    std::fprintf(stderr, "usage: bench_memory [CUT >= 1] [BATCH >= 1] [TOKENS >= 1] [STEPS >= 2] [MODEL_DIR|random] "
                         "[THREADS >= 1]\n");
    return 2;
  }
  const bool random_model = argc <= 5 || std::string(argv[5]) == "random";
  const std::string dir = random_model ? (std::filesystem::temp_directory_path() / ("amaq-bench-memory-" + std::to_string(getpid()))).string()
                                       : std::string(argv[5]);
  const std::string written = !random_model ? "ok" : InChild([&] {
    torch::manual_seed(0);
    const ModelConfig c = BenchConfig(s.cut + 1);
    ModelPart whole(c, PartSpec::Whole(c));
    SaveModel(whole, dir);
    return std::string("ok");
  });
  if (written != "ok") {
    std::fprintf(stderr, "bench_memory: writing the random model to %s failed: check the free space there\n", dir.c_str());
    std::filesystem::remove_all(dir);
    return 1;
  }
  std::printf("client part: embedding + layers [0, %lld) of %s; "
              "LoRA rank 16 on every projection; batch %lld x %lld tokens; %lld steps; %lld threads. MiB.\n\n",
              static_cast<long long>(s.cut), random_model ? "a random model with TinyLlama-1.1B's shapes" : dir.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.tokens),
              static_cast<long long>(s.steps), static_cast<long long>(s.threads));
  std::printf("| base weights | base bytes | LoRA bytes | libraries (RSS before) | after loading | peak | tokens/s |\n"
              "|---|---|---|---|---|---|---|\n");
  int failures = 0;
  struct Row {
    BaseWeights format;
    bool recompute, return_frees;
    torch::Dtype compute;
  };
  const torch::Dtype fp32 = torch::kFloat, bf16 = torch::kBFloat16;
  for (const Row& r : {Row{BaseWeights::kFp32, false, false, fp32}, Row{BaseWeights::kFp32, false, true, fp32},
                       Row{BaseWeights::kFp32, true, true, fp32}, Row{BaseWeights::kFp32, false, true, bf16},
                       Row{BaseWeights::kFp32, false, false, bf16}, Row{BaseWeights::kBf16, false, true, fp32},
                       Row{BaseWeights::kBf16, false, true, bf16},
                       Row{BaseWeights::kInt8, false, true, fp32},
                       Row{BaseWeights::kNf4, false, true, fp32}, Row{BaseWeights::kNf4, true, true, fp32},
                       Row{BaseWeights::kNf4, false, true, bf16}, Row{BaseWeights::kNf4, true, true, bf16}}) {
    const BaseWeights format = r.format;
    const std::string row = InChild([&] { return Measure(dir, s, r.format, r.recompute, r.return_frees, r.compute); });
    if (row.empty()) ++failures;
    std::printf("%s", row.empty() ? ("| " + ToString(format) + " | failed (see above) |\n").c_str() : row.c_str());
    std::fflush(stdout);
  }
  std::printf("\n'after loading' and 'peak' exclude the libraries' RSS.\n");
  if (random_model) std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
