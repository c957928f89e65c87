// amaq-finetune: local (unsplit, uncompressed) LoRA fine-tuning of a model directory on one of
// amaq's tasks, printing the validation metric. The reference point for split training, and the
// measurement that pretraining helps (--random-init trains the same LoRA on random weights).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <thread>

#include "common/text/datasets.h"
#include "common/base/error.h"
#include "common/model/finetune.h"
#include "common/model/threads.h"

using namespace amaq;

int main(int argc, char** argv) {
  CLI::App app{"amaq-finetune: local LoRA fine-tuning and evaluation"};
  FinetuneOptions o;
  o.model_dir = "models/amaq-base";
  std::string task = "wordnet", data = "data";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  app.add_option("--model", o.model_dir, "Hugging Face model directory")->capture_default_str();
  app.add_option("--task", task, "wordnet | verbs | arithmetic")->check(CLI::IsMember({"wordnet", "verbs", "arithmetic"}))->capture_default_str();
  app.add_option("--data", data, "data directory (scripts/fetch-data)")->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--batch", o.batch, "examples per step")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate of the LoRA weights")->capture_default_str();
  app.add_option("--rank", o.lora.rank, "LoRA rank")->capture_default_str();
  app.add_option("--eval-examples", o.eval_examples, "validation examples to evaluate")->capture_default_str();
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_flag("--random-init", o.random_init, "train the same LoRA on a randomly initialised model");
  std::string base_weights = "fp32";
  app.add_option("--base-weights", base_weights, "how the frozen base is held: fp32 | bf16 | nf4 | int8 (docs/model.md)")
      ->check(CLI::IsMember({"fp32", "bf16", "nf4", "int8"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.base_weights = ParseBaseWeights(base_weights);
  o.lora.alpha = 2.0 * static_cast<double>(o.lora.rank);
  SetComputeThreads(threads);
  try {
    const Dataset dataset = task == "wordnet" ? LoadWordNetTopics(data)
                          : task == "verbs"   ? LoadVerbPastTense(data)
                                              : MakeArithmetic(3, 20000, 500, 500, 7);
    const FinetuneResult r = FinetuneLocal(dataset, o);
    const size_t tail = std::min<size_t>(20, r.losses.size());
    double first = 0, last = 0;
    for (size_t i = 0; i < tail; ++i) {
      first += r.losses[i] / static_cast<double>(tail);
      last += r.losses[r.losses.size() - 1 - i] / static_cast<double>(tail);
    }
    std::printf("task %s  model %s%s  steps %lld  loss %.3f -> %.3f  %s %.4f  (%lld validation examples, %.0f s)\n",
                task.c_str(), o.model_dir.c_str(), o.random_init ? " (random init)" : "", static_cast<long long>(o.steps),
                first, last, dataset.is_classification() ? "accuracy" : "exact-match", r.metric,
                static_cast<long long>(o.eval_examples), r.seconds);
    return 0;
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
