#include "common/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>

#include "common/error.h"

namespace amaq {

SentencePieceTokenizer::SentencePieceTokenizer()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::Load(const std::string& model_path) {
  Require(std::filesystem::exists(model_path), ErrorCode::kNotFound,
          model_path + ": SentencePiece model not found");
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  const auto status = t->processor_->Load(model_path);
  Require(status.ok(), ErrorCode::kDataLoss,
          model_path + ": not a valid SentencePiece model (" + status.ToString() + ")");
  return t;
}

std::vector<int64_t> SentencePieceTokenizer::Encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  Require(status.ok(), ErrorCode::kInvalidArgument, "SentencePiece cannot encode the text: " + status.ToString());
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  for (int64_t id : ids) {
    Require(id >= 0 && id < vocab_size(), ErrorCode::kInvalidArgument,
            "token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size()));
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = processor_->Decode(narrow, &text);
  Require(status.ok(), ErrorCode::kInvalidArgument, "SentencePiece cannot decode: " + status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }

std::optional<int64_t> SentencePieceTokenizer::TokenId(const std::string& token) const {
  const int id = processor_->PieceToId(token);
  if (id == processor_->unk_id() && token != processor_->IdToPiece(id)) return std::nullopt;
  return id;
}

void TrainSentencePiece(const std::string& text_file, const std::string& prefix, int vocab_size) {
  const std::string args = "--input=" + text_file + " --model_prefix=" + prefix +
                           " --vocab_size=" + std::to_string(vocab_size) +
                           " --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
                           " --normalization_rule_name=identity --split_digits=true"
                           " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3"
                           " --input_sentence_size=2000000 --shuffle_input_sentence=true"
                           " --num_threads=2 --minloglevel=1";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  Require(status.ok(), ErrorCode::kInternal, "SentencePiece training failed: " + status.ToString());
}

}  // namespace amaq
