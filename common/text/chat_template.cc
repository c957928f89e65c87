#include "common/text/chat_template.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "common/base/error.h"

namespace amaq {
namespace {
constexpr char kStart[] = "<|im_start|>";
constexpr char kEnd[] = "<|im_end|>";
constexpr char kSystemOpening[] = "<|im_start|>system\n";
}  // namespace

ChatTemplate ChatTemplate::Load(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  std::ifstream in(path);
  Require(in.good(), ErrorCode::kNotFound,
          path + ": cannot open it, so the model has no chat template: give the prompt without --chat");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kDataLoss, path + ": not JSON (" + std::string(e.what()) + ")");
  }
  Require(config.contains("chat_template") && config["chat_template"].is_string(), ErrorCode::kNotFound,
          path + ": has no chat_template (not an instruct model?): give the prompt without --chat");
  ChatTemplate t = Parse(config["chat_template"].get<std::string>(), path);
  t.adds_bos_ = config.value("add_bos_token", false);
  return t;
}

ChatTemplate ChatTemplate::Parse(const std::string& jinja, const std::string& source) {
  Require(jinja.find(kStart) != std::string::npos && jinja.find(kEnd) != std::string::npos &&
              jinja.find("message['role']") != std::string::npos && jinja.find("message['content']") != std::string::npos,
          ErrorCode::kInvalidArgument,
          source + ": the chat template is not ChatML (<|im_start|>role ... <|im_end|>), the one family amaq "
                   "renders: apply the template yourself and give the result as the prompt, without --chat");
  ChatTemplate t;
  // A default system message: a literal "<|im_start|>system\n...<|im_end|>" that the template
  // writes when the first message is not a system one.
  const size_t opening = jinja.find(kSystemOpening);
  if (opening != std::string::npos && jinja.find("!= 'system'") != std::string::npos) {
    const size_t begin = opening + sizeof(kSystemOpening) - 1;
    const size_t end = jinja.find(kEnd, begin);
    Require(end != std::string::npos, ErrorCode::kInvalidArgument,
            source + ": the chat template's default system message has no <|im_end|>: fix the template");
    t.default_system_ = jinja.substr(begin, end - begin);
  }
  return t;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  std::string text;
  if (default_system_ && (messages.empty() || messages.front().role != "system")) {
    text += kSystemOpening + *default_system_ + kEnd + "\n";
  }
  for (const ChatMessage& m : messages) text += kStart + m.role + "\n" + m.content + kEnd + "\n";
  return text + kStart + "assistant\n";
}

}  // namespace amaq
