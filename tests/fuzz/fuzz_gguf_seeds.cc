// Writes the GGUF fuzzer's starting corpus into the folder given: the reader tests' sample file
// (every metadata value type, an F32 and a Q8_0 tensor) in versions 2 and 3, and a small model's
// worth of metadata (strings, arrays of strings and integers) with F32 tensors.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gguf_writer.h"

namespace {
void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_gguf_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  using namespace amaq::testing_gguf;
  Write(dir + "/sample-v2.gguf", SampleFile(2));
  Write(dir + "/sample-v3.gguf", SampleFile(3));
  GgufBuilder b;
  b.Str("general.architecture", "llama");
  b.U32("llama.block_count", 1);
  b.F32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  b.Bool("tokenizer.ggml.add_bos_token", false);
  b.Strs("tokenizer.ggml.tokens", {"a", "b", "ab", "<|s|>"});
  b.I32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  b.Tensor("token_embd.weight", {8, 4}, std::vector<float>(32, 0.5f));
  b.Tensor("output_norm.weight", {8}, std::vector<float>(8, 1.0f));
  Write(dir + "/model.gguf", b.Bytes());
  return 0;
}
