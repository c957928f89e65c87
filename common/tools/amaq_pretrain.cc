// amaq-pretrain: trains amaq's own small LLaMA-family base model, since no pretrained weights can
// be installed on these machines. It trains a SentencePiece tokenizer on the pretraining text
// (State of the Union, Moby-Dick, Brown corpus: scripts/fetch-data), then the model on next-token
// prediction, and writes a Hugging Face model directory (config.json, model.safetensors,
// tokenizer.model, training.json with the command and the validation perplexity).
// Resumable: it checkpoints every checkpoint_every steps into <out>/.pretrain/ and continues
// from there when started again with the same out. Settings are keys of a --config YAML file or
// flags, as for the other programs (docs/configuration.md).
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/base/atomic_file.h"
#include "common/base/config.h"
#include "common/base/option_keys.h"
#include "common/base/program.h"
#include "common/model/batching.h"
#include "common/model/checkpoint.h"
#include "common/text/datasets.h"
#include "common/base/error.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"
#include "common/base/progress.h"
#include "common/text/sentencepiece_tokenizer.h"
#include "common/model/threads.h"

namespace fs = std::filesystem;
using namespace amaq;

namespace {

struct Options {
  std::string data = "data";
  std::string out = "models/amaq-base";
  int vocab = 4096;
  ModelConfig model;
  int64_t steps = 3000;
  int64_t batch = 32;
  int64_t tokens = 128;
  double lr = 3e-3;
  int64_t warmup = 100;
  double weight_decay = 0.1;
  int64_t checkpoint_every = 250;
  int64_t eval_windows = 64;
  int threads = 0;  // every core
  uint64_t seed = 1;
};

// SentencePiece skips lines longer than 4192 bytes: cut documents at sentence ends.
void WriteSentences(const std::vector<std::string>& docs, const std::string& path) {
  std::ofstream out(path);
  for (const std::string& doc : docs) {
    std::istringstream lines(doc);
    for (std::string line; std::getline(lines, line);) {
      size_t start = 0;
      while (start < line.size()) {
        size_t end = std::min(line.size(), start + 1000);
        const size_t dot = line.rfind(". ", end);
        if (end < line.size() && dot != std::string::npos && dot > start) end = dot + 1;
        out << line.substr(start, end - start) << "\n";
        start = end;
        while (start < line.size() && line[start] == ' ') ++start;
      }
    }
  }
}

std::vector<int32_t> Tokenize(const Tokenizer& tokenizer, const std::vector<std::string>& docs, int64_t eos) {
  std::vector<int32_t> stream;
  for (const std::string& doc : docs) {
    for (int64_t id : tokenizer.Encode(doc)) stream.push_back(static_cast<int32_t>(id));
    stream.push_back(static_cast<int32_t>(eos));
  }
  return stream;
}

double LearningRate(const Options& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const double progress = static_cast<double>(step - o.warmup) / static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress)));  // cosine down to 10%
}

// Fixed validation windows: every window of the held-out stream at a stride, the same each run.
std::vector<Batch> ValidationBatches(const std::vector<int32_t>& stream, const Options& o) {
  std::vector<Batch> batches;
  const int64_t stride = std::max<int64_t>(o.tokens, (static_cast<int64_t>(stream.size()) - o.tokens - 1) / o.eval_windows);
  for (int64_t w = 0; w < o.eval_windows; w += 16) {
    const int64_t n = std::min<int64_t>(16, o.eval_windows - w);
    Batch b{torch::empty({n, o.tokens}, torch::kLong), torch::ones({n, o.tokens}, torch::kLong), torch::Tensor(), {}};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = (w + i) * stride;
      for (int64_t j = 0; j < o.tokens; ++j) b.ids[i][j] = stream[static_cast<size_t>(s + j)];
    }
    b.labels = b.ids.clone();
    batches.push_back(std::move(b));
  }
  return batches;
}

struct TrainState {
  int64_t step = 0;
  std::mt19937_64 rng;
  double seconds = 0;  // training time across resumed runs
};

void SaveState(const std::string& path, ModelPart& model, torch::optim::AdamW& optimizer, const TrainState& s) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  model->save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("step", torch::tensor(s.step));
  archive.write("seconds", torch::tensor(s.seconds, torch::kDouble));
  std::ostringstream rng;
  rng << s.rng;
  archive.write("rng", c10::IValue(rng.str()));
  std::ostringstream bytes;
  archive.save_to(bytes);
  WriteFileAtomically(path, bytes.str());
}

void LoadState(const std::string& path, ModelPart& model, torch::optim::AdamW& optimizer, TrainState* s) {
  torch::serialize::InputArchive archive, model_archive, optimizer_archive;
  archive.load_from(path);
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  model->load(model_archive);
  optimizer.load(optimizer_archive);
  torch::Tensor step, seconds;
  archive.read("step", step);
  archive.read("seconds", seconds);
  s->step = step.item<int64_t>();
  s->seconds = seconds.item<double>();
  c10::IValue rng;
  archive.read("rng", rng);
  std::istringstream(rng.toStringRef()) >> s->rng;
}

// The SentencePiece tokenizer in `o.out`, trained on the corpus first when it is not there yet.
std::unique_ptr<SentencePieceTokenizer> TokenizerFor(const Options& o, const TextCorpus& corpus) {
  const std::string spm = o.out + "/tokenizer.model";
  if (!fs::exists(spm)) {
    spdlog::info("training a {}-piece SentencePiece tokenizer on {} documents", o.vocab, corpus.train.size());
    WriteSentences(corpus.train, o.out + "/.pretrain/sentences.txt");
    TrainSentencePiece(o.out + "/.pretrain/sentences.txt", o.out + "/tokenizer", o.vocab);
    fs::remove(o.out + "/tokenizer.vocab");
  }
  return SentencePieceTokenizer::Load(spm);
}

// tokenizer_config.json for Hugging Face's LlamaTokenizer over tokenizer.model.
void WriteTokenizerConfig(const std::string& dir) {
  const nlohmann::json tokenizer_config = {{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", "<s>"},
                                           {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"},
                                           {"add_bos_token", true}, {"add_eos_token", false}};
  WriteFileAtomically(dir + "/tokenizer_config.json", tokenizer_config.dump(2) + "\n");
}

int Run(const Options& o, const std::string& command) {
  SetComputeThreads(o.threads);
  fs::create_directories(o.out + "/.pretrain");
  const TextCorpus corpus = LoadPretrainingText(o.data);

  const auto tokenizer = TokenizerFor(o, corpus);
  ModelConfig config = o.model;
  config.vocab_size = tokenizer->vocab_size();
  config.bos_token_id = 1;
  config.eos_token_id = 2;
  config.Validate("amaq-pretrain flags");

  spdlog::info("tokenizing the corpus");
  const std::vector<int32_t> train = Tokenize(*tokenizer, corpus.train, config.eos_token_id);
  const std::vector<int32_t> validation = Tokenize(*tokenizer, corpus.validation, config.eos_token_id);
  spdlog::info("{} training tokens, {} validation tokens", train.size(), validation.size());

  torch::manual_seed(o.seed);
  ModelPart model(config, PartSpec::Whole(config));
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  spdlog::info("model: {} layers, hidden {}, {} heads ({} kv), {} parameters", config.num_hidden_layers,
               config.hidden_size, config.num_attention_heads, config.num_key_value_heads, parameters);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(o.weight_decay));

  TrainState state;
  state.rng.seed(o.seed);
  const std::string state_path = o.out + "/.pretrain/state.pt";
  if (fs::exists(state_path)) {
    LoadState(state_path, model, optimizer, &state);
    spdlog::info("resuming from step {} ({})", state.step, state_path);
  }

  const std::vector<Batch> eval_batches = ValidationBatches(validation, o);
  const SequenceScorer score = [&](const Batch& b) { return SequenceLogProbs(model->LogitsAtLabels(b.ids, b.mask, b.labels), b.labels); };
  Progress progress("pretrain", o.steps);
  double smoothed = 0;
  auto started = std::chrono::steady_clock::now();
  for (; state.step < o.steps; ++state.step) {
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(LearningRate(o, state.step));
    }
    const Batch b = SampleWindows(train, o.batch, o.tokens, state.rng);
    const torch::Tensor loss = NextTokenLoss(model->LogitsAtLabels(b.ids, b.mask, b.labels), b.labels);
    optimizer.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    smoothed = smoothed == 0 ? loss.item<double>() : 0.98 * smoothed + 0.02 * loss.item<double>();
    const double elapsed = state.seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char fields[96];
    std::snprintf(fields, sizeof fields, "loss %.3f  %.0f tok/s", smoothed,
                  static_cast<double>((state.step + 1) * o.batch * o.tokens) / std::max(1.0, elapsed));
    progress.Update(state.step + 1, fields);
    if ((state.step + 1) % o.checkpoint_every == 0 && state.step + 1 < o.steps) {
      TrainState saved = state;
      saved.step = state.step + 1;
      saved.seconds = elapsed;
      SaveState(state_path, model, optimizer, saved);
    }
  }
  state.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  model->eval();
  const double ppl = Perplexity(score, eval_batches);
  progress.Finish("validation perplexity " + std::to_string(ppl));
  SaveModel(model, o.out, torch::kFloat);
  WriteTokenizerConfig(o.out);
  const nlohmann::json record = {{"command", command}, {"steps", o.steps}, {"batch", o.batch}, {"tokens", o.tokens},
                                 {"training_tokens", train.size()}, {"parameters", parameters},
                                 {"train_seconds", state.seconds}, {"validation_perplexity", ppl},
                                 {"threads", o.threads}};
  WriteFileAtomically(o.out + "/training.json", record.dump(2) + "\n");
  fs::remove_all(o.out + "/.pretrain");
  spdlog::info("wrote {} ({} parameters, validation perplexity {:.2f}, {:.0f} s)", o.out, parameters, ppl, state.seconds);
  return 0;
}


template <typename Keys>
void PretrainOptionKeys(Keys& keys) {
  using O = Options;
  keys.String("data", &O::data, "data directory (scripts/fetch-data)");
  keys.String("out", &O::out, "output model directory (its .pretrain/ checkpoint resumes a run)");
  keys.Int("vocab", &O::vocab, "SentencePiece vocabulary size", 64, 1 << 20);
  keys.Int("steps", &O::steps, "optimizer steps", 1, INT64_MAX);
  keys.Int("batch", &O::batch, "sequences per step", 1, 1 << 20);
  keys.Int("tokens", &O::tokens, "tokens per sequence (at most 512, the model's positions)", 2, 512);
  keys.Double("lr", &O::lr, "peak learning rate (AdamW, cosine to 10%)", 0, 10);
  keys.Int("warmup", &O::warmup, "warm-up steps", 0, INT64_MAX);
  keys.Int("checkpoint_every", &O::checkpoint_every, "steps between resumable checkpoints", 1, INT64_MAX);
  keys.Int("threads", &O::threads, "intra-op CPU threads (0: every core)", 0, 1024);
  keys.Int("seed", &O::seed, "random seed", 0, INT64_MAX);
}

Config PretrainConfig() {
  Config c("amaq-pretrain");
  DeclareOptionKeys<Options>(c, [](auto& keys) { PretrainOptionKeys(keys); });
  c.AddInt("hidden", 256, "hidden size", 8, 1 << 16);
  c.AddInt("intermediate", 688, "MLP size", 8, 1 << 18);
  c.AddInt("layers", 4, "transformer layers", 1, 1024);
  c.AddInt("heads", 8, "attention heads (they divide hidden)", 1, 1024);
  c.AddInt("kv_heads", 4, "key/value heads (they divide heads)", 1, 1024);
  AddProgramKeys(c);
  return c;
}

Options PretrainOptionsFrom(const Config& c) {
  Options o = OptionsFrom<Options>(c, [](auto& keys) { PretrainOptionKeys(keys); });
  o.model.model_type = "llama";
  o.model.hidden_size = c.Int("hidden");
  o.model.intermediate_size = c.Int("intermediate");
  o.model.num_hidden_layers = c.Int("layers");
  o.model.num_attention_heads = c.Int("heads");
  o.model.num_key_value_heads = c.Int("kv_heads");
  o.model.max_position_embeddings = 512;
  o.model.rms_norm_eps = 1e-5;
  o.model.tie_word_embeddings = true;
  Require(o.model.hidden_size % o.model.num_attention_heads == 0 && o.model.num_attention_heads % o.model.num_key_value_heads == 0,
          ErrorCode::kInvalidArgument, "heads must divide hidden, and kv_heads heads: e.g. hidden 256, heads 8, kv_heads 4");
  o.model.head_dim = o.model.hidden_size / o.model.num_attention_heads;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Config config = PretrainConfig();
  std::string command = "amaq-pretrain";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return RunProgram(config, argc, argv, [&](const Config& c) { return Run(PretrainOptionsFrom(c), command); },
                    [](const Config& c) { PretrainOptionsFrom(c); });
}
