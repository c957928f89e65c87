#include "common/text/sentencepiece_tokenizer.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "common/base/error.h"

namespace amaq {
namespace {

constexpr int kErrorCapacity = 512;

// The plugin's C interface (common/text/sentencepiece_plugin.cc), loaded once per process.
struct Plugin {
  void* (*load)(const char*, char*, int);
  void (*free)(void*);
  int (*encode)(void*, const char*, int, int*, int, char*, int);
  int (*decode)(void*, const int*, int, char*, int, char*, int);
  int (*piece_size)(void*);
  int (*piece_to_id)(void*, const char*);
  int (*train)(const char*, char*, int);
};

// Next to the running program, else where the build put it.
std::string PluginPath() {
  const std::filesystem::path beside =
      std::filesystem::read_symlink("/proc/self/exe").parent_path() / AMAQ_SPM_PLUGIN_NAME;
  return std::filesystem::exists(beside) ? beside.string() : std::string(AMAQ_SPM_PLUGIN_BUILD_PATH);
}

const Plugin& LoadPlugin() {
  static std::once_flag once;
  static Plugin plugin;
  static std::string failure;
  std::call_once(once, [] {
    const std::string path = PluginPath();
    void* handle = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      failure = path + ": cannot load the SentencePiece plugin (" + dlerror() +
                "): reinstall amaq so that " AMAQ_SPM_PLUGIN_NAME " sits next to the program";
      return;
    }
    const auto bind = [&](auto* slot, const char* name) {
      *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(dlsym(handle, name));
      if (!*slot) failure = path + ": the SentencePiece plugin lacks " + name;
    };
    bind(&plugin.load, "amaq_spm_load");
    bind(&plugin.free, "amaq_spm_free");
    bind(&plugin.encode, "amaq_spm_encode");
    bind(&plugin.decode, "amaq_spm_decode");
    bind(&plugin.piece_size, "amaq_spm_piece_size");
    bind(&plugin.piece_to_id, "amaq_spm_piece_to_id");
    bind(&plugin.train, "amaq_spm_train");
  });
  Require(failure.empty(), ErrorCode::kFailedPrecondition, failure);
  return plugin;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer() = default;

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (processor_) LoadPlugin().free(processor_);
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::Load(const std::string& model_path) {
  Require(std::filesystem::exists(model_path), ErrorCode::kNotFound,
          model_path + ": SentencePiece model not found");
  char error[kErrorCapacity] = {};
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->processor_ = LoadPlugin().load(model_path.c_str(), error, kErrorCapacity);
  Require(t->processor_ != nullptr, ErrorCode::kDataLoss,
          model_path + ": not a valid SentencePiece model (" + error + ")");
  return t;
}

std::vector<int64_t> SentencePieceTokenizer::EncodePlain(const std::string& text) const {
  char error[kErrorCapacity] = {};
  std::vector<int> ids(text.size() + 16);  // byte fallback: at most one id per byte, plus pieces
  const int n = LoadPlugin().encode(processor_, text.data(), static_cast<int>(text.size()), ids.data(),
                                    static_cast<int>(ids.size()), error, kErrorCapacity);
  Require(n >= 0, ErrorCode::kInvalidArgument, std::string("SentencePiece cannot encode the text: ") + error);
  Require(n <= static_cast<int>(ids.size()), ErrorCode::kInternal, "SentencePiece returned more ids than bytes");
  return std::vector<int64_t>(ids.begin(), ids.begin() + n);
}

std::string SentencePieceTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  for (int64_t id : ids) {
    Require(id >= 0 && id < vocab_size(), ErrorCode::kInvalidArgument,
            "token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size()));
    narrow.push_back(static_cast<int>(id));
  }
  char error[kErrorCapacity] = {};
  std::string text(64 + 16 * narrow.size(), '\0');
  int n = LoadPlugin().decode(processor_, narrow.data(), static_cast<int>(narrow.size()), text.data(),
                              static_cast<int>(text.size()), error, kErrorCapacity);
  Require(n >= 0, ErrorCode::kInvalidArgument, std::string("SentencePiece cannot decode: ") + error);
  if (n >= static_cast<int>(text.size())) {  // longer than guessed: decode again into enough room
    text.assign(static_cast<size_t>(n) + 1, '\0');
    n = LoadPlugin().decode(processor_, narrow.data(), static_cast<int>(narrow.size()), text.data(),
                            static_cast<int>(text.size()), error, kErrorCapacity);
  }
  text.resize(static_cast<size_t>(n));
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return LoadPlugin().piece_size(processor_); }

std::optional<int64_t> SentencePieceTokenizer::TokenId(const std::string& token) const {
  const int id = LoadPlugin().piece_to_id(processor_, token.c_str());
  if (id < 0) return std::nullopt;
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
  char error[kErrorCapacity] = {};
  Require(LoadPlugin().train(args.c_str(), error, kErrorCapacity) == 0, ErrorCode::kInternal,
          std::string("SentencePiece training failed: ") + error);
}

}  // namespace amaq
