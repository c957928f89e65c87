// The chat format of an instruct model, from its tokenizer_config.json's `chat_template`. amaq
// renders the ChatML family (<|im_start|>role\ncontent<|im_end|>\n per message, then
// <|im_start|>assistant\n to prompt an answer: SmolLM2's and templates like it), including a template's default
// system message (the one it adds when the conversation has none); other templates are refused
// with an error rather than guessed. No Jinja: a template is recognised by its markers.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace amaq {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // The template of `model_dir`/tokenizer_config.json. Throws amaq::Error: kNotFound when the
  // file or its chat_template is missing, kInvalidArgument for a template that is not ChatML.
  static ChatTemplate Load(const std::string& model_dir);
  // The same from the template's text; `source` names it in errors.
  static ChatTemplate Parse(const std::string& jinja, const std::string& source);

  // The conversation as the model saw it in training, ending with the assistant's turn opened.
  std::string Render(const std::vector<ChatMessage>& messages) const;
  const std::optional<std::string>& default_system() const { return default_system_; }
  // Whether BOS goes before the rendered text: tokenizer_config.json's add_bos_token, false when
  // absent (a ChatML text is the whole prompt).
  bool adds_bos() const { return adds_bos_; }

 private:
  std::optional<std::string> default_system_;
  bool adds_bos_ = false;
};

}  // namespace amaq
