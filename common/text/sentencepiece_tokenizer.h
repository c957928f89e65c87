// SentencePiece (tokenizer.model) through Debian's libsentencepiece: LLaMA-2 and TinyLlama ship
// it, and amaq's own base model uses one trained on its pretraining text (TrainSentencePiece).
// The library is reached through a plugin loaded at run time (common/text/sentencepiece_plugin.cc says
// why); a missing plugin is an amaq::Error, not a crash.
#pragma once

#include <memory>
#include <string>

#include "common/text/tokenizer.h"

namespace amaq {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws amaq::Error (kNotFound / kDataLoss) naming the file.
  static std::unique_ptr<SentencePieceTokenizer> Load(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::string Decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> TokenId(const std::string& token) const override;

 protected:
  std::vector<int64_t> EncodePlain(const std::string& text) const override;

 private:
  SentencePieceTokenizer();
  void* processor_ = nullptr;  // owned by the plugin
};

// Trains a BPE SentencePiece model on a text file (one sentence per line) and writes
// <prefix>.model and <prefix>.vocab; ids: 0 <unk>, 1 <s>, 2 </s>, 3 <pad>. LLaMA's choices: no
// text normalization (identity), digits split, unseen bytes encoded as <0xNN> byte pieces.
void TrainSentencePiece(const std::string& text_file, const std::string& prefix, int vocab_size);

}  // namespace amaq
