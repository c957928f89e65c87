// amaq-generate: text from a fine-tuned model. A base model directory with a PEFT adapter (what
// amaq-client's adapter_out writes: the client's layers and the server's), or a merged directory
// (merged_out), continues a prompt with a KV cache: greedy by default, or sampled with
// temperature, top-k and top-p; it stops at EOS, a stop text or max_new_tokens.
//
// With chat, the prompt is a user's message, put in the model's chat template (an instruct model's
// tokenizer_config.json; ChatML, common/text/chat_template.h) with the assistant's turn opened.
//
//   amaq-generate --model models/amaq-base --adapter runs/demo/adapter-client-1 --prompt "past tense of go:"
//   amaq-generate --model models/smollm2-135m-instruct --chat --prompt "What is the past tense of swim?"
//
// Settings are keys of a --config YAML file or flags, as for the other programs (docs/configuration.md).
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <iterator>

#include "common/base/config.h"
#include "common/base/error.h"
#include "common/base/program.h"
#include "common/model/checkpoint.h"
#include "common/model/generate.h"
#include "common/model/threads.h"
#include "common/text/chat_template.h"

using namespace amaq;

namespace {

Config GenerateConfig() {
  const GenerationOptions defaults;
  Config c("amaq-generate");
  c.AddString("model", "models/amaq-base", "Hugging Face model directory: the base, or a merged model (merged_out)");
  c.AddString("adapter", "", "PEFT adapter directory to load on the base (adapter_out); empty: none");
  c.AddString("prompt", "", "the prompt (required); - reads it from standard input");
  c.AddInt("max_new_tokens", defaults.max_new_tokens, "most tokens to generate", 1, 1 << 20);
  c.AddDouble("temperature", defaults.sampling.temperature, "0: greedy; > 0: sample from softmax(logits / temperature)", 0, 1e6);
  c.AddInt("top_k", defaults.sampling.top_k, "with temperature > 0: sample among the k most likely tokens (0: all)", 0, INT32_MAX);
  c.AddDouble("top_p", defaults.sampling.top_p, "with temperature > 0: sample among the most likely tokens up to this probability", 1e-9, 1);
  c.AddStrings("stop", "stop before this text (repeatable; none: at EOS or max_new_tokens)");
  c.AddInt("seed", static_cast<int64_t>(defaults.seed), "seed of the sampling", 0, INT64_MAX);
  c.AddString("special_tokens", "parse", "special tokens in the prompt: parse (become their ids) or plain (stay text)",
              {"parse", "plain"});
  c.AddBool("chat", false, "the prompt is a user's message: answer it in the model's chat template (instruct models)");
  c.AddString("system", "", "with chat: the system message (default: the template's own, if it has one)");
  c.AddInt("threads", 0, "intra-op CPU threads (0: every core)", 0, 1024);
  c.AddBool("quiet", false, "print the continuation only, once at the end (no streaming, no summary, no settings: only warnings and errors are logged)");
  AddProgramKeys(c);
  return c;
}

void CheckGenerateConfig(const Config& c) {
  Require(!c.String("prompt").empty(), ErrorCode::kInvalidArgument, "set prompt (the text to continue, or - to read it from standard input)");
  Require(c.Double("temperature") > 0 || (c.Int("top_k") == 0 && c.Double("top_p") == 1), ErrorCode::kInvalidArgument,
          "top_k and top_p choose among tokens to sample, and temperature 0 is greedy: set temperature > 0 (e.g. 0.8), or drop them");
  Require(c.Bool("chat") || c.String("system").empty(), ErrorCode::kInvalidArgument,
          "system goes with chat: set chat, or drop system");
  Require(!c.Bool("chat") || c.String("special_tokens") == "parse", ErrorCode::kInvalidArgument,
          "chat needs special_tokens parse: the template's markers are special tokens");
}

int Run(const Config& c) {
  CheckGenerateConfig(c);
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  const std::string model_dir = c.String("model"), adapter = c.String("adapter");
  GenerationOptions o;
  o.max_new_tokens = c.Int("max_new_tokens");
  o.sampling.temperature = c.Double("temperature");
  o.sampling.top_k = c.Int("top_k");
  o.sampling.top_p = c.Double("top_p");
  o.stop = c.Strings("stop");
  o.seed = static_cast<uint64_t>(c.Int("seed"));
  std::string prompt = c.String("prompt");
  if (prompt == "-") {
    prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    Require(!prompt.empty(), ErrorCode::kInvalidArgument, "prompt - read nothing from standard input: pipe the prompt in");
  }
  if (c.Bool("chat")) {
    std::vector<ChatMessage> messages;
    if (!c.String("system").empty()) messages.push_back({"system", c.String("system")});
    messages.push_back({"user", prompt});
    const ChatTemplate chat_template = ChatTemplate::Load(model_dir);
    prompt = chat_template.Render(messages);
    o.bos = chat_template.adds_bos();
  }
  const ModelConfig config = ModelConfig::Load(model_dir + "/config.json");
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(model_dir, ParseSpecialTokens(c.String("special_tokens")));
  ModelPart model{nullptr};
  if (adapter.empty()) {
    model = ModelPart(config, PartSpec::Whole(config));
    LoadPartWeights(model, model_dir);
  } else {
    const MergedModel merged = LoadMergedModel(model_dir, adapter);
    model = merged.model;
    if (merged.covered < merged.lora_tensors) {
      spdlog::warn("the adapter holds {} of the {} LoRA tensors of the whole model: the other layers run as the base "
                   "(an adapter of one side only; export it with adapter_out from an amaq-client run against a current server)",
                   merged.covered, merged.lora_tensors);
    }
  }
  model->eval();
  const bool quiet = c.Bool("quiet");
  const auto stream = [&](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  const Generation g = Generate(model, *tokenizer, prompt, o, quiet ? std::function<void(const std::string&)>() : stream);
  if (quiet) std::fwrite(g.text.data(), 1, g.text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the text's end before the summary on stderr
  if (!quiet) spdlog::info("{} tokens, finished by {}", g.tokens.size(), g.finish);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_logger_mt("amaq-generate"));  // stdout holds the text alone
  Config config = GenerateConfig();
  return RunProgram(config, argc, argv, Run, CheckGenerateConfig);
}
