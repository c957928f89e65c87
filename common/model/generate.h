// Text generation with a whole model (a base with a loaded adapter, or a merged directory): the
// prompt is encoded as fine-tuning encodes it (BOS + prompt; the model continues with " " and the
// completion, common/model/batching.h), prefilled once into a KV cache (decoders.h), and then
// extended one token at a time until EOS, a stop string or max_new_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "common/model/sampling.h"
#include "common/text/tokenizer.h"

namespace amaq {

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // generation ends before the first of these in the text
  uint64_t seed = 1;
  // The prompt follows the model's BOS token, as amaq's training rows do (common/model/batching.h);
  // false for a prompt that is complete as it is (a chat template's text, ChatTemplate::adds_bos).
  bool bos = true;
};

struct Generation {
  std::string text;              // the continuation, without the stop string
  std::vector<int64_t> tokens;   // what was generated (EOS excluded)
  std::string finish;            // "eos" | "stop" | "length"
};

// `model` holds the embedding and the head. `on_text` (may be empty) receives the text as it
// grows, in pieces that never hold back a stop string. Throws amaq::Error (kInvalidArgument) for
// a prompt longer than the model's positions or bad options.
Generation Generate(ModelPart& model, const Tokenizer& tokenizer, const std::string& prompt,
                    const GenerationOptions& options, const std::function<void(const std::string&)>& on_text = {});

}  // namespace amaq
