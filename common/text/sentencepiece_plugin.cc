// The SentencePiece plugin: a shared object that links Debian's libsentencepiece and exposes a
// C interface. Debian's libsentencepiece carries its own copy of protobuf-lite and exports it;
// in a process that also loads LibTorch's libprotobuf the two copies interpose each other and
// the process crashes at start-up. amaq therefore never links libsentencepiece into a program:
// common/text/sentencepiece_tokenizer.cc loads this plugin with dlopen(RTLD_LOCAL | RTLD_DEEPBIND),
// so each copy of protobuf only ever sees itself. Only C types cross this boundary.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

// Copies `text` into the caller's buffer (NUL-terminated, truncated to capacity) and returns its
// full length.
int CopyOut(const std::string& text, char* out, int capacity) {
  if (capacity > 0) {
    const size_t n = std::min(text.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return static_cast<int>(text.size());
}

}  // namespace

extern "C" {

// Returns a processor, or null with the error in `error`.
void* amaq_spm_load(const char* path, char* error, int error_capacity) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    CopyOut(status.ToString(), error, error_capacity);
    delete processor;
    return nullptr;
  }
  return processor;
}

void amaq_spm_free(void* processor) { delete static_cast<sentencepiece::SentencePieceProcessor*>(processor); }

// Encodes `size` bytes of text; writes up to `capacity` ids and returns how many there are
// (-1 on error, with the message in `error`).
int amaq_spm_encode(void* processor, const char* text, int size, int* ids, int capacity, char* error,
                    int error_capacity) {
  std::vector<int> out;
  const auto status = static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Encode(
      std::string(text, static_cast<size_t>(size)), &out);
  if (!status.ok()) {
    CopyOut(status.ToString(), error, error_capacity);
    return -1;
  }
  for (size_t i = 0; i < out.size() && i < static_cast<size_t>(capacity); ++i) ids[i] = out[i];
  return static_cast<int>(out.size());
}

// Decodes ids into `out`; returns the text's length (-1 on error).
int amaq_spm_decode(void* processor, const int* ids, int count, char* out, int capacity, char* error,
                    int error_capacity) {
  std::string text;
  const auto status = static_cast<sentencepiece::SentencePieceProcessor*>(processor)->Decode(
      std::vector<int>(ids, ids + count), &text);
  if (!status.ok()) {
    CopyOut(status.ToString(), error, error_capacity);
    return -1;
  }
  return CopyOut(text, out, capacity);
}

int amaq_spm_piece_size(void* processor) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

// The id of a piece, or -1 when it is not in the vocabulary.
int amaq_spm_piece_to_id(void* processor, const char* piece) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  const int id = p->PieceToId(piece);
  return id == p->unk_id() && p->IdToPiece(id) != piece ? -1 : id;
}

// Trains a model from command-line style arguments; returns 0, or -1 with the error.
int amaq_spm_train(const char* args, char* error, int error_capacity) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    CopyOut(status.ToString(), error, error_capacity);
    return -1;
  }
  return 0;
}

}  // extern "C"
