#include "common/text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "common/text/bpe_tokenizer.h"
#include "common/base/error.h"
#include "common/text/sentencepiece_tokenizer.h"

namespace amaq {
namespace {

// A tokenizer.json is usable by BpeTokenizer when its model is BPE with a byte-level pre-tokenizer;
// SentencePiece-style BPE (LLaMA-2's Metaspace) goes through tokenizer.model instead.
bool IsByteLevelBpe(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return false;
  return json.dump().find("\"ByteLevel\"") != std::string::npos &&
         json.value("model", nlohmann::json::object()).value("type", "") == "BPE";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::string json = (dir / "tokenizer.json").string();
  const std::string spm = (dir / "tokenizer.model").string();
  if (std::filesystem::exists(json) && IsByteLevelBpe(json)) return BpeTokenizer::FromTokenizerJson(json);
  if (std::filesystem::exists(spm)) return SentencePieceTokenizer::Load(spm);
  if (std::filesystem::exists(dir / "vocab.json") && std::filesystem::exists(dir / "merges.txt")) {
    return BpeTokenizer::FromVocabAndMerges((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }
  throw Error(ErrorCode::kNotFound,
              model_dir + ": no tokenizer found (looked for a byte-level tokenizer.json, tokenizer.model, "
                          "vocab.json + merges.txt): copy the model's tokenizer files into it");
}

}  // namespace amaq
