// A complete model directory small enough for tests: a 300-piece SentencePiece tokenizer trained
// on a few lines, and a tiny LLaMA-family model (every architectural feature on) whose head has
// the scale of a trained one.
#pragma once

#include <fstream>
#include <string>

#include "common/checkpoint.h"
#include "common/sentencepiece_tokenizer.h"
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

}  // namespace amaq::testing
