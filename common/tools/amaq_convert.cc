// amaq-convert: a LLaMA-architecture GGUF file (llama.cpp's format, e.g. a Q4_1 SmolLM2) as a
// Hugging Face model directory that amaq and transformers load: config.json from the llama.*
// metadata, model.safetensors (fp32, dequantized, q/k rows in transformers' order), tokenizer.json
// and tokenizer_config.json (chat template included) from tokenizer.ggml.*.
//
//   amaq-convert --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2-135m-instruct
//
// Settings are keys of a --config YAML file or flags, as for the other programs (docs/configuration.md).
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/base/config.h"
#include "common/base/error.h"
#include "common/base/program.h"
#include "common/model/gguf_model.h"

using namespace amaq;

namespace {

Config ConvertConfig() {
  Config c("amaq-convert");
  c.AddString("gguf", "", "the .gguf file (required)");
  c.AddString("out", "", "the model directory to write (required; created, its files are replaced)");
  AddProgramKeys(c);
  return c;
}

void CheckConvertConfig(const Config& c) {
  Require(!c.String("gguf").empty(), ErrorCode::kInvalidArgument, "set gguf: the .gguf file to convert");
  Require(!c.String("out").empty(), ErrorCode::kInvalidArgument, "set out: the model directory to write");
}

int Run(const Config& c) {
  CheckConvertConfig(c);
  const std::string gguf = c.String("gguf"), out = c.String("out");
  const auto start = std::chrono::steady_clock::now();
  spdlog::info("converting {} into {} ...", gguf, out);
  ConvertGgufToHf(gguf, out);
  spdlog::info("wrote {} (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) in {:.1f} s", out,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config = ConvertConfig();
  return RunProgram(config, argc, argv, Run, CheckConvertConfig);
}
