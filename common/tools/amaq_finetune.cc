// amaq-finetune: local (unsplit, uncompressed) LoRA fine-tuning of a model directory on one of
// amaq's tasks, printing the validation metric. The reference point for split training, and the
// measurement that pretraining helps (random_init trains the same LoRA on random weights).
// Settings are keys of a --config YAML file or flags, as for the other programs (docs/configuration.md).
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/base/config.h"
#include "common/base/error.h"
#include "common/base/option_keys.h"
#include "common/base/program.h"
#include "common/model/finetune.h"
#include "common/model/threads.h"
#include "common/text/datasets.h"

using namespace amaq;

namespace {

template <typename Keys>
void FinetuneOptionKeys(Keys& keys) {
  using O = FinetuneOptions;
  keys.Int("steps", &O::steps, "optimizer steps", 1, INT64_MAX);
  keys.Int("batch", &O::batch, "examples per step", 1, 1 << 20);
  keys.Double("lr", &O::lr, "AdamW learning rate of the LoRA weights", 0, 10);
  keys.Int("eval_examples", &O::eval_examples, "validation examples to evaluate", 1, INT64_MAX);
  keys.Int("seed", &O::seed, "random seed", 0, INT64_MAX);
  keys.Bool("random_init", &O::random_init, "train the same LoRA on a randomly initialised model");
}

Config FinetuneConfig() {
  Config c("amaq-finetune");
  c.AddString("model", "models/amaq-base", "Hugging Face model directory");
  DeclareOptionKeys<FinetuneOptions>(c, [](auto& keys) { FinetuneOptionKeys(keys); });
  c.AddString("task", "wordnet", "data set (docs/data.md)", {"wordnet", "verbs", "arithmetic"});
  c.AddString("data", "data", "data directory (scripts/fetch-data)");
  c.AddInt("lora_rank", LoraConfig().rank, "LoRA rank (alpha is twice the rank)", 1, 4096);
  c.AddString("base_weights", "fp32", "how the frozen base is held (docs/model.md)", {"fp32", "bf16", "nf4", "int8"});
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  AddProgramKeys(c);
  return c;
}

int Run(const Config& c) {
  FinetuneOptions o = OptionsFrom<FinetuneOptions>(c, [](auto& keys) { FinetuneOptionKeys(keys); });
  o.model_dir = c.String("model");
  o.lora.rank = c.Int("lora_rank");
  o.lora.alpha = 2.0 * static_cast<double>(o.lora.rank);
  o.base_weights = ParseBaseWeights(c.String("base_weights"));
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  const std::string task = c.String("task");
  const Dataset dataset = task == "wordnet" ? LoadWordNetTopics(c.String("data"))
                        : task == "verbs"   ? LoadVerbPastTense(c.String("data"))
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
}

}  // namespace

int main(int argc, char** argv) {
  Config config = FinetuneConfig();
  return RunProgram(config, argc, argv, Run, [](const Config& c) { ParseBaseWeights(c.String("base_weights")); });
}
