// amaq-generate: text from a fine-tuned model. A base model directory with a PEFT adapter (what
// amaq-client's adapter_out writes: the client's layers and the server's), or a merged directory
// (merged_out), continues a prompt with a KV cache: greedy by default, or sampled with
// temperature, top-k and top-p; it stops at EOS, a stop string or --max-new-tokens.
//
// With --chat, the prompt is a user's message, put in the model's chat template (an instruct model's
// tokenizer_config.json; ChatML, common/text/chat_template.h) with the assistant's turn opened.
//
//   amaq-generate --model models/amaq-base --adapter runs/demo/adapter-client-1 --prompt "past tense of go:"
//   amaq-generate --model models/smollm2-135m-instruct --chat --prompt "What is the past tense of swim?"
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <thread>

#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "common/model/generate.h"
#include "common/model/threads.h"
#include "common/text/chat_template.h"

using namespace amaq;

int main(int argc, char** argv) {
  CLI::App app{"amaq-generate: continue a prompt with a fine-tuned model (KV cache; greedy or sampled)"};
  std::string model_dir = "models/amaq-base", adapter, prompt, special_tokens = "parse";
  GenerationOptions o;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  bool quiet = false, chat = false;
  std::string system;
  app.add_option("--model", model_dir, "Hugging Face model directory: the base, or a merged model (merged_out)")->capture_default_str();
  app.add_option("--adapter", adapter, "PEFT adapter directory to load on the base (adapter_out); empty: none");
  app.add_option("--prompt", prompt, "the prompt; - reads it from standard input")->required();
  app.add_option("--max-new-tokens", o.max_new_tokens, "most tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--temperature", o.sampling.temperature, "0: greedy; > 0: sample from softmax(logits / temperature)")->capture_default_str();
  app.add_option("--top-k", o.sampling.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  app.add_option("--top-p", o.sampling.top_p, "sample among the most likely tokens up to this probability")->capture_default_str();
  app.add_option("--stop", o.stop, "stop before this text (repeatable)");
  app.add_option("--seed", o.seed, "seed of the sampling")->capture_default_str();
  app.add_option("--special-tokens", special_tokens, "special tokens in the prompt: parse (become their ids) or plain (stay text)")
      ->check(CLI::IsMember({"parse", "plain"}))->capture_default_str();
  app.add_flag("--chat", chat, "the prompt is a user's message: answer it in the model's chat template (instruct models)");
  app.add_option("--system", system, "with --chat: the system message (default: the template's own, if it has one)");
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_flag("--quiet", quiet, "print the continuation only, once at the end (no streaming, no summary)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_logger_mt("amaq-generate"));  // stdout holds the text alone
  SetComputeThreads(threads);
  try {
    if (prompt == "-") prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (chat) {
      Require(special_tokens == "parse", ErrorCode::kInvalidArgument,
              "--chat needs --special-tokens parse: the template's markers are special tokens");
      std::vector<ChatMessage> messages;
      if (!system.empty()) messages.push_back({"system", system});
      messages.push_back({"user", prompt});
      const ChatTemplate chat_template = ChatTemplate::Load(model_dir);
      prompt = chat_template.Render(messages);
      o.bos = chat_template.adds_bos();
    } else {
      Require(system.empty(), ErrorCode::kInvalidArgument, "--system goes with --chat: add --chat, or drop --system");
    }
    const ModelConfig config = ModelConfig::Load(model_dir + "/config.json");
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(model_dir, ParseSpecialTokens(special_tokens));
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
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
