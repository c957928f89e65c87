// ChatTemplate (common/text/chat_template.h) on SmolLM2-135M-Instruct's template, copied from its
// GGUF file: the rendered text written out by hand from the template; scripts/gguf-interop checks
// amaq-generate --chat against transformers' apply_chat_template on the real model.
#include "common/text/chat_template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "common/base/error.h"

namespace amaq {
namespace {

const char kSmolLm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}";

TEST(ChatTemplate, RendersSmolLm2WithItsDefaultSystemMessage) {
  const ChatTemplate t = ChatTemplate::Parse(kSmolLm2, "smollm2");
  ASSERT_TRUE(t.default_system().has_value());
  EXPECT_EQ(t.Render({{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.Render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMlWithoutADefaultAddsNoSystemMessage) {
  const ChatTemplate t = ChatTemplate::Parse(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
      "'\n'}}{% endfor %}",
      "plain");
  EXPECT_FALSE(t.default_system().has_value());
  EXPECT_EQ(t.Render({{"user", "Hi"}}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, LoadReadsTheTemplateAndWhetherBosGoesFirst) {
  const std::string dir = ::testing::TempDir() + "/chat-template-model";
  std::filesystem::create_directories(dir);
  for (const bool bos : {false, true}) {
    nlohmann::json config = {{"chat_template", kSmolLm2}};
    if (bos) config["add_bos_token"] = true;
    std::ofstream(dir + "/tokenizer_config.json") << config.dump();
    const ChatTemplate t = ChatTemplate::Load(dir);
    EXPECT_EQ(t.adds_bos(), bos);  // absent: false, the rendered text is the whole prompt
    EXPECT_TRUE(t.default_system().has_value());
  }
  std::ofstream(dir + "/tokenizer_config.json") << "{\"bos_token\": \"<s>\"}";
  try {
    ChatTemplate::Load(dir);
    ADD_FAILURE() << "a tokenizer_config.json without chat_template gave a template";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("has no chat_template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, OtherTemplatesAreRefusedNotGuessed) {
  // Llama 2's [INST] format.
  try {
    ChatTemplate::Parse("{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}", "llama2");
    ADD_FAILURE() << "a template that is not ChatML was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("llama2: the chat template is not ChatML"), std::string::npos) << e.what();
  }
  try {
    ChatTemplate::Load("/nonexistent-model");
    ADD_FAILURE() << "a model without tokenizer_config.json had a template";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

}  // namespace
}  // namespace amaq
