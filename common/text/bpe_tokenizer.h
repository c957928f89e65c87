// Byte-level BPE as GPT-2 defined it: the text is split by a pre-tokenizer regex (PCRE2, Unicode
// classes), each piece's UTF-8 bytes are mapped to printable characters (bytes_to_unicode), and
// merges are applied lowest rank first until none applies. Special tokens ("added_tokens") are
// matched literally before pre-tokenization (tokenizer.h). Verified id for id against the npm package
// gpt-3-encoder (tests/tokenizer_test.cc).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/text/tokenizer.h"

namespace amaq {

class BpeTokenizer : public Tokenizer {
 public:
  // GPT-2's pre-tokenizer regex.
  static const char kGpt2Pattern[];

  // vocab.json + merges.txt (the original GPT-2 files). Like GPT-2's own encoder, it treats
  // "<|endoftext|>" in text as plain text; tokenizer.json's added_tokens are matched as specials.
  static std::unique_ptr<BpeTokenizer> FromVocabAndMerges(const std::string& vocab_json,
                                                          const std::string& merges_txt);
  // A Hugging Face tokenizer.json with a BPE model and a ByteLevel / Split pre-tokenizer.
  static std::unique_ptr<BpeTokenizer> FromTokenizerJson(const std::string& path);

  ~BpeTokenizer() override;
  std::string Decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> TokenId(const std::string& token) const override;

 protected:
  std::vector<int64_t> EncodePlain(const std::string& text) const override;

 private:
  BpeTokenizer() = default;
  struct Regex;
  void SetPatterns(const std::vector<std::string>& patterns, const std::string& source);
  void EncodePiece(const std::string& piece, std::vector<int64_t>* ids) const;
  std::vector<std::string> PreTokenize(const std::string& text) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int> ranks_;  // "left right" -> merge rank
  std::vector<std::unique_ptr<Regex>> patterns_;  // applied in sequence (Split ... Split)
  bool ignore_merges_ = false;
  std::string byte_to_symbol_[256];
  std::unordered_map<std::string, uint8_t> symbol_to_byte_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace amaq
