// Tokenizer: text <-> token ids. Two families, both loaded from a Hugging Face model directory:
//   - byte-level BPE (GPT-2, LLaMA-3, Qwen2): tokenizer.json, or vocab.json + merges.txt;
//   - SentencePiece (LLaMA-2, TinyLlama, amaq's own base model): tokenizer.model.
// Encode adds no BOS/EOS; callers add them from the model config.
//
// Special tokens (tokenizer.json's added_tokens; tokenizer_config.json's bos/eos/unk/pad tokens and
// added_tokens_decoder) are parsed in text by default, as Hugging Face tokenizers do: "</s>" in
// the text becomes the id of </s>. With SpecialTokens::kPlain they are text like any other, so
// that user text cannot inject control tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace amaq {

enum class SpecialTokens { kParse, kPlain };
// "parse" | "plain"; throws amaq::Error (kInvalidArgument) for anything else.
SpecialTokens ParseSpecialTokens(const std::string& text);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws amaq::Error (kInvalidArgument) on text that is not valid UTF-8.
  std::vector<int64_t> Encode(const std::string& text) const;
  virtual std::string Decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The id of a token given by its exact text (special tokens such as "<|endoftext|>").
  virtual std::optional<int64_t> TokenId(const std::string& token) const = 0;

  // The special tokens Encode parses (in kParse mode), longest first.
  const std::vector<std::pair<std::string, int64_t>>& special_tokens() const { return specials_; }
  void set_special_tokens(SpecialTokens mode) { mode_ = mode; }
  SpecialTokens special_token_mode() const { return mode_; }

  // Picks the tokenizer a model directory ships: tokenizer.json (byte-level BPE), else
  // tokenizer.model (SentencePiece), else vocab.json + merges.txt, and reads the special tokens
  // the directory names. Throws amaq::Error (kNotFound) naming the files it looked for.
  static std::unique_ptr<Tokenizer> Load(const std::string& model_dir, SpecialTokens mode = SpecialTokens::kParse);

 protected:
  // Text without special tokens to ids.
  virtual std::vector<int64_t> EncodePlain(const std::string& text) const = 0;
  // Adds a special token (ignored when its text is empty or already known).
  void AddSpecialToken(const std::string& text, int64_t id);

 private:
  std::vector<std::pair<std::string, int64_t>> specials_;
  SpecialTokens mode_ = SpecialTokens::kParse;
};

}  // namespace amaq
