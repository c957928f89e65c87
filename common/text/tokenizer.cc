#include "common/text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
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

std::unique_ptr<Tokenizer> LoadFamily(const std::filesystem::path& dir) {
  const std::string json = (dir / "tokenizer.json").string();
  const std::string spm = (dir / "tokenizer.model").string();
  if (std::filesystem::exists(json) && IsByteLevelBpe(json)) return BpeTokenizer::FromTokenizerJson(json);
  if (std::filesystem::exists(spm)) return SentencePieceTokenizer::Load(spm);
  if (std::filesystem::exists(dir / "vocab.json") && std::filesystem::exists(dir / "merges.txt")) {
    return BpeTokenizer::FromVocabAndMerges((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }
  throw Error(ErrorCode::kNotFound,
              dir.string() + ": no tokenizer found (looked for a byte-level tokenizer.json, tokenizer.model, "
                             "vocab.json + merges.txt): copy the model's tokenizer files into it");
}

// A token in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::string TokenText(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) return value.at("content").get<std::string>();
  return "";
}

}  // namespace

SpecialTokens ParseSpecialTokens(const std::string& text) {
  if (text == "parse") return SpecialTokens::kParse;
  Require(text == "plain", ErrorCode::kInvalidArgument,
          "special_tokens must be parse (special tokens in text become their ids) or plain (text stays text), got '" +
              Excerpt(text) + "'");
  return SpecialTokens::kPlain;
}

std::vector<int64_t> Tokenizer::Encode(const std::string& text) const {
  if (mode_ == SpecialTokens::kPlain || specials_.empty()) return text.empty() ? std::vector<int64_t>{} : EncodePlain(text);
  std::vector<int64_t> ids;
  size_t at = 0;
  while (at < text.size()) {
    // The earliest special token from `at`; at one place, the longest (specials_ is longest first).
    size_t special_at = std::string::npos;
    const std::pair<std::string, int64_t>* special = nullptr;
    for (const auto& s : specials_) {
      const size_t found = text.find(s.first, at);
      if (found < special_at) {
        special_at = found;
        special = &s;
      }
    }
    const size_t end = special ? special_at : text.size();
    if (end > at) {
      const std::vector<int64_t> plain = EncodePlain(text.substr(at, end - at));
      ids.insert(ids.end(), plain.begin(), plain.end());
    }
    if (!special) break;
    ids.push_back(special->second);
    at = special_at + special->first.size();
  }
  return ids;
}

void Tokenizer::AddSpecialToken(const std::string& text, int64_t id) {
  if (text.empty()) return;
  for (const auto& s : specials_) {
    if (s.first == text) return;
  }
  specials_.emplace_back(text, id);
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& model_dir, SpecialTokens mode) {
  const std::filesystem::path dir(model_dir);
  std::unique_ptr<Tokenizer> tokenizer = LoadFamily(dir);
  tokenizer->set_special_tokens(mode);
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) return tokenizer;
  std::ifstream in(config_path);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  Require(!config.is_discarded() && config.is_object(), ErrorCode::kDataLoss,
          config_path.string() + " is not a JSON object: restore the model's tokenizer_config.json or delete it");
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const std::string text = config.contains(key) ? TokenText(config.at(key)) : "";
    if (const std::optional<int64_t> id = text.empty() ? std::nullopt : tokenizer->TokenId(text)) tokenizer->AddSpecialToken(text, *id);
  }
  const nlohmann::json added = config.value("added_tokens_decoder", nlohmann::json::object());
  for (const auto& [id, token] : added.items()) {
    const std::string text = TokenText(token);
    char* end = nullptr;
    const long long value = std::strtoll(id.c_str(), &end, 10);
    Require(!id.empty() && *end == '\0' && value >= 0 && value < tokenizer->vocab_size(), ErrorCode::kDataLoss,
            config_path.string() + ": added_tokens_decoder names id '" + Excerpt(id) + "', not an id of the vocabulary: "
            "restore the model's tokenizer_config.json");
    tokenizer->AddSpecialToken(text, value);
  }
  return tokenizer;
}

}  // namespace amaq
