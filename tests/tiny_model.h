// A complete model directory small enough for tests: a 300-piece SentencePiece tokenizer trained
// on a few lines, and a tiny LLaMA-family model (every architectural feature on) whose head has
// the scale of a trained one.
#pragma once

#include <fstream>
#include <string>

#include "client/split_client.h"
#include "common/model/finetune.h"
#include "common/model/checkpoint.h"
#include "server/split_server.h"
#include "common/text/sentencepiece_tokenizer.h"
#include "model_test_util.h"

namespace amaq::testing {

inline std::string TinyModelDir(const std::string& name) {
  const std::string dir = TempDir(name);
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "past tense of walk: walked. past tense of jump: jumped. " << i << " + " << i << " = " << 2 * i << "\n";
      corpus << "dog: a domesticated animal. oak: a tree. topic: animal plant\n";
    }
  }
  TrainSentencePiece(dir + "/corpus.txt", dir + "/tokenizer", 300);
  ModelConfig c = TinyConfig();
  c.vocab_size = 300;
  torch::manual_seed(1234);  // the same model whatever ran before in this process
  ModelPart model(c, PartSpec::Whole(c));
  {
    // A trained model's head separates tokens; 0.02-scale random rows cap every logit near 0 and
    // leave a frozen-base LoRA nothing to steer.
    torch::NoGradGuard no_grad;
    model->lm_head.normal_(0, 1);
  }
  SaveModel(model, dir);
  return dir;
}

// "item N:" -> animal / plant by parity: a classification task a tiny model learns in tens of steps.
inline Dataset ParityDataset(int examples) {
  Dataset d;
  d.name = "parity";
  d.labels = {"animal", "plant"};
  for (int i = 0; i < examples; ++i) d.train.push_back({"item " + std::to_string(i) + ":", d.labels[i % 2], i % 2});
  for (int i = 0; i < 8; ++i) d.validation.push_back(d.train[static_cast<size_t>(i)]);
  return d;
}

// Every projection at rank 8, alpha 16: the adapter the tests' margins were measured with.
inline LoraConfig AllTargets() {
  LoraConfig lora;
  lora.rank = 8;
  lora.alpha = 16;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return lora;
}

// A server and clients for a tiny model directory, split after layer 2, seed 7, lr 1e-2.
inline server::ServerOptions TinyServerOptions(const std::string& dir) {
  server::ServerOptions o;
  o.model_dir = dir;
  o.cut_layer = 2;
  o.lora = AllTargets();
  o.lr = 1e-2;
  o.seed = 7;
  o.compute_dtype = "fp32";  // not auto: the margins are fp32's, and auto's choice depends on the CPU
  return o;
}

inline client::ClientOptions TinyClientOptions(const std::string& dir, const std::string& id, const std::string& method,
                                               int64_t steps) {
  client::ClientOptions o;
  o.client_id = id;
  o.model_dir = dir;
  o.cut_layer = 2;
  o.method = method;
  o.lora = AllTargets();
  o.lr = 1e-2;
  o.steps = steps;
  o.batch = 8;
  o.micro_batches = 4;  // fixed: over a network auto's count depends on timing, and the tests repeat runs bit for bit
  o.compute_dtype = "fp32";  // not auto: the margins are fp32's, and auto's choice depends on the CPU
  o.seed = 7;
  o.eval_examples = 8;
  o.progress = false;
  o.retry_seconds = 30;
  return o;
}

// The same training locally (unsplit), for equivalence tests.
inline FinetuneOptions TinyLocalOptions(const std::string& dir, int64_t steps) {
  FinetuneOptions o;
  o.model_dir = dir;
  o.lora = AllTargets();
  o.lr = 1e-2;
  o.steps = steps;
  o.batch = 8;
  o.seed = 7;
  o.eval_examples = 8;
  o.progress = false;
  return o;
}

}  // namespace amaq::testing
