// Tokenizer: text <-> token ids. Two families, both loaded from a Hugging Face model directory:
//   - byte-level BPE (GPT-2, LLaMA-3, Qwen2): tokenizer.json, or vocab.json + merges.txt;
//   - SentencePiece (LLaMA-2, TinyLlama, amaq's own base model): tokenizer.model.
// Encode adds no BOS/EOS; callers add them from the model config.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace amaq {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws amaq::Error (kInvalidArgument) on text that is not valid UTF-8.
  virtual std::vector<int64_t> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The id of a token given by its exact text (special tokens such as "<|endoftext|>").
  virtual std::optional<int64_t> TokenId(const std::string& token) const = 0;

  // Picks the tokenizer a model directory ships: tokenizer.json (byte-level BPE), else
  // tokenizer.model (SentencePiece), else vocab.json + merges.txt. Throws amaq::Error
  // (kNotFound) naming the files it looked for.
  static std::unique_ptr<Tokenizer> Load(const std::string& model_dir);
};

}  // namespace amaq
