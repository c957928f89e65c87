#include "common/text/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <climits>
#include <functional>
#include <fstream>
#include <sstream>

#include "common/base/error.h"

namespace amaq {

const char BpeTokenizer::kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

std::string CodePointToUtf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return 4;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  Require(in.good(), ErrorCode::kNotFound, path + ": cannot open tokenizer file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kDataLoss, path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::SetPatterns(const std::vector<std::string>& patterns, const std::string& source) {
  for (const std::string& pattern : patterns) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!regex->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw Error(ErrorCode::kInvalidArgument, source + ": pre-tokenizer regex does not compile at offset " +
                                                   std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
    }
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    patterns_.push_back(std::move(regex));
  }
  // bytes_to_unicode: printable bytes map to themselves, the others to code points 256 and up.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
    byte_to_symbol_[b] = CodePointToUtf8(cp);
    symbol_to_byte_[byte_to_symbol_[b]] = static_cast<uint8_t>(b);
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::FromVocabAndMerges(const std::string& vocab_json,
                                                               const std::string& merges_txt) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  const nlohmann::json vocab = ReadJson(vocab_json);
  for (const auto& [token, id] : vocab.items()) t->vocab_[token] = id.get<int64_t>();
  std::ifstream merges(merges_txt);
  Require(merges.good(), ErrorCode::kNotFound, merges_txt + ": cannot open BPE merges");
  std::string line;
  int rank = 0;
  while (std::getline(merges, line)) {
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    Require(line.find(' ') != std::string::npos, ErrorCode::kDataLoss,
            merges_txt + ": line '" + line + "' is not a merge ('left right')");
    t->ranks_.emplace(line, rank++);
  }
  t->SetPatterns({kGpt2Pattern}, vocab_json);
  t->id_to_token_.resize(t->vocab_.size());
  for (const auto& [token, id] : t->vocab_) {
    Require(id >= 0 && id < static_cast<int64_t>(t->vocab_.size()), ErrorCode::kDataLoss,
            vocab_json + ": token ids must be 0..size-1");
    t->id_to_token_[static_cast<size_t>(id)] = token;
  }
  return t;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::FromTokenizerJson(const std::string& path) {
  const nlohmann::json json = ReadJson(path);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  try {
    const nlohmann::json& model = json.at("model");
    Require(model.value("type", "") == "BPE", ErrorCode::kInvalidArgument,
            path + ": model type '" + model.value("type", "") + "' is not BPE: use tokenizer.model (SentencePiece)");
    for (const auto& [token, id] : model.at("vocab").items()) t->vocab_[token] = id.get<int64_t>();
    int rank = 0;
    for (const nlohmann::json& merge : model.at("merges")) {
      const std::string key = merge.is_string() ? merge.get<std::string>()
                                                : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>();
      t->ranks_.emplace(key, rank++);
    }
    t->ignore_merges_ = model.value("ignore_merges", false);
    std::vector<std::string> patterns;
    bool byte_level = false;
    const std::function<void(const nlohmann::json&)> collect = [&](const nlohmann::json& pre) {
      if (pre.is_null()) return;
      const std::string type = pre.at("type").get<std::string>();
      if (type == "Sequence") {
        for (const auto& p : pre.at("pretokenizers")) collect(p);
      } else if (type == "ByteLevel") {
        byte_level = true;
        if (pre.value("use_regex", true)) patterns.push_back(kGpt2Pattern);
      } else if (type == "Split") {
        const nlohmann::json& pattern = pre.at("pattern");
        Require(pattern.contains("Regex") && pre.value("behavior", "Isolated") == "Isolated",
                ErrorCode::kInvalidArgument, path + ": only Split pre-tokenizers with a Regex and behavior Isolated are supported");
        patterns.push_back(pattern.at("Regex").get<std::string>());
      } else {
        throw Error(ErrorCode::kInvalidArgument,
                    path + ": pre-tokenizer '" + type + "' is not supported (ByteLevel, Split, Sequence are)");
      }
    };
    collect(json.value("pre_tokenizer", nlohmann::json()));
    Require(byte_level, ErrorCode::kInvalidArgument,
            path + ": not a byte-level BPE tokenizer: use the model's tokenizer.model (SentencePiece) instead");
    t->SetPatterns(patterns, path);
    int64_t size = 0;
    for (const auto& [token, id] : t->vocab_) size = std::max(size, id + 1);
    for (const nlohmann::json& added : json.value("added_tokens", nlohmann::json::array())) {
      const int64_t id = added.at("id").get<int64_t>();
      t->AddSpecialToken(added.at("content").get<std::string>(), id);
      t->vocab_[added.at("content").get<std::string>()] = id;
      size = std::max(size, id + 1);
    }
    t->id_to_token_.resize(static_cast<size_t>(size));
    for (const auto& [token, id] : t->vocab_) t->id_to_token_[static_cast<size_t>(id)] = token;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kDataLoss, path + ": unexpected tokenizer.json layout (" + e.what() + ")");
  }
  return t;
}

std::vector<std::string> BpeTokenizer::PreTokenize(const std::string& text) const {
  std::vector<std::string> pieces = {text};
  pcre2_match_data* match = nullptr;
  for (const auto& regex : patterns_) {
    match = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t at = 0, gap = 0;
      while (at <= piece.size()) {
        const int rc = pcre2_match(regex->code, subject, piece.size(), at, 0, match, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(match);
          throw Error(ErrorCode::kInvalidArgument,
                      "text is not valid UTF-8 (PCRE2 error " + std::to_string(rc) + "): clean the input data");
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const size_t begin = ovector[0], end = ovector[1];
        if (begin > gap) next.push_back(piece.substr(gap, begin - gap));  // Isolated: keep gaps
        if (end > begin) next.push_back(piece.substr(begin, end - begin));
        gap = end;
        at = end > begin ? end : end + (end < piece.size() ? Utf8Length(static_cast<unsigned char>(piece[end])) : 1);
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    pcre2_match_data_free(match);
    pieces.swap(next);
  }
  return pieces;
}

void BpeTokenizer::EncodePiece(const std::string& piece, std::vector<int64_t>* ids) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::string> word;
  std::string joined;
  for (unsigned char b : piece) {
    word.push_back(byte_to_symbol_[b]);
    joined += byte_to_symbol_[b];
  }
  std::vector<int64_t> out;
  const auto whole = vocab_.find(joined);
  if (ignore_merges_ && whole != vocab_.end()) {
    out.push_back(whole->second);
  } else {
    while (word.size() > 1) {
      int best = INT_MAX;
      size_t best_at = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        const auto it = ranks_.find(word[i] + " " + word[i + 1]);
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          best_at = i;
        }
      }
      if (best == INT_MAX) break;
      const std::string left = word[best_at], right = word[best_at + 1];
      std::vector<std::string> merged;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          merged.push_back(left + right);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      word.swap(merged);
    }
    for (const std::string& symbol : word) {
      const auto it = vocab_.find(symbol);
      Require(it != vocab_.end(), ErrorCode::kDataLoss,
              "BPE vocabulary lacks the symbol '" + symbol + "': the tokenizer files are incomplete");
      out.push_back(it->second);
    }
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < 1000000) cache_.emplace(piece, out);
  ids->insert(ids->end(), out.begin(), out.end());
}

std::vector<int64_t> BpeTokenizer::EncodePlain(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& piece : PreTokenize(text)) EncodePiece(piece, &ids);
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    Require(id >= 0 && id < static_cast<int64_t>(id_to_token_.size()), ErrorCode::kInvalidArgument,
            "token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(id_to_token_.size()));
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    bool special = false;
    for (const auto& s : special_tokens()) special = special || s.second == id;
    if (special) {
      out += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      const size_t n = Utf8Length(static_cast<unsigned char>(token[i]));
      const auto it = symbol_to_byte_.find(token.substr(i, n));
      if (it != symbol_to_byte_.end()) {
        out += static_cast<char>(it->second);
      } else {
        out += token.substr(i, n);
      }
      i += n;
    }
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }

std::optional<int64_t> BpeTokenizer::TokenId(const std::string& token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

}  // namespace amaq
