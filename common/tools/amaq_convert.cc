// amaq-convert: a LLaMA-architecture GGUF file (llama.cpp's format, e.g. a Q4_1 SmolLM2) as a
// Hugging Face model directory that amaq and transformers load: config.json from the llama.*
// metadata, model.safetensors (fp32, dequantized, q/k rows in transformers' order), tokenizer.json
// and tokenizer_config.json (chat template included) from tokenizer.ggml.*.
//
//   amaq-convert --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2-135m-instruct
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/base/error.h"
#include "common/model/gguf_model.h"

using namespace amaq;

int main(int argc, char** argv) {
  CLI::App app{"amaq-convert: a LLaMA-architecture GGUF file as a Hugging Face model directory"};
  std::string gguf, out;
  app.add_option("--gguf", gguf, "the .gguf file")->required();
  app.add_option("--out", out, "the model directory to write (created; its files are replaced)")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto start = std::chrono::steady_clock::now();
    spdlog::info("converting {} into {} ...", gguf, out);
    ConvertGgufToHf(gguf, out);
    spdlog::info("wrote {} (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) in {:.1f} s", out,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return 0;
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
