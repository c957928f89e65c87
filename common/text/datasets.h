// The data sets amaq trains and evaluates on, read from the files scripts/fetch-data puts in data/
// exactly as their packages ship them, with fixed splits that never change between runs.
//
//   WordNet topics   "<word>: <gloss>\ntopic:" -> one of 25 noun lexicographer classes (noun.act ...
//                    noun.time; noun.Tops, the 51 unique beginners, is left out). Debian wordnet-base.
//   Verb past tense  "past tense of <verb>:" -> "<past>". Regular verbs train and validate; the
//                    363 irregular ones (past not ending in -ed) are the held-out hard test.
//                    Debian python3-pattern's en-verbs.txt (extracted, not installed).
//   Arithmetic       "<a> + <b> =" -> "<a + b>", generated from a seed (std::mt19937_64).
//   Pretraining text State of the Union 1790-2021, Moby-Dick, the Brown corpus (tags stripped).
//   User data        JSONL or CSV files: common/text/user_data.h.
//
// Splits are by a hash of each example's identity (the synset offset, the verb), so they are
// stable, disjoint, and independent of file order; each split is then shuffled with a fixed seed,
// so that its first N examples are a fair sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace amaq {

// The model sees prompt + " " + completion; the loss and the metrics cover the completion only.
struct Example {
  std::string prompt;
  std::string completion;  // generation target; for classification, the label's name
  int label = -1;          // classification: index into Dataset::labels
};

struct Dataset {
  std::string name;
  std::vector<std::string> labels;  // class names (classification only)
  std::vector<Example> train, validation, test;
  bool is_classification() const { return !labels.empty(); }
};

// Each loader throws amaq::Error (kNotFound) naming the missing file and saying to run
// scripts/fetch-data. `data_dir` is the repository's data/ folder.
Dataset LoadWordNetTopics(const std::string& data_dir);
Dataset LoadVerbPastTense(const std::string& data_dir);
Dataset MakeArithmetic(int digits, size_t train, size_t validation, size_t test, uint64_t seed);

struct TextCorpus {
  std::vector<std::string> train, validation;  // documents; about 2% held out by hash
};
TextCorpus LoadPretrainingText(const std::string& data_dir);

// Which split (0 train, 1 validation, 2 test) an identity falls into, for fractions of 100.
int SplitOf(const std::string& identity, int validation_percent, int test_percent);

}  // namespace amaq
