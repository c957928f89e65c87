#include "common/base/config.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "common/base/error.h"
#include "common/base/option_keys.h"

namespace amaq {
namespace {

Config Make() {
  Config c("amaq-test");
  c.AddString("method", "bf16", "how to compress", {"bf16", "fp32"});
  c.AddString("model", "models/base", "model dir");
  c.AddInt("cut_layer", 2, "split point", 0, 4);
  c.AddDouble("lr", 1e-3, "learning rate", 0, 1);
  c.AddBool("insecure", false, "plain text");
  return c;
}

std::string ErrorOf(const std::string& yaml, const std::vector<std::string>& flags) {
  Config c = Make();
  try {
    c.Load(yaml, "test.yaml", flags);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Config, FlagsOverrideTheFileWhichOverridesDefaults) {
  Config c = Make();
  c.Load("method: fp32\ncut_layer: 3\nlr: 0.5\n", "test.yaml", {"--cut-layer", "1", "--insecure", "--model=/m"});
  EXPECT_EQ(c.String("method"), "fp32");
  EXPECT_EQ(c.Int("cut_layer"), 1);
  EXPECT_DOUBLE_EQ(c.Double("lr"), 0.5);
  EXPECT_TRUE(c.Bool("insecure"));
  EXPECT_EQ(c.String("model"), "/m");
  EXPECT_NE(c.Dump().find("cut_layer: 1"), std::string::npos);
}

// A program built on another's keys gives one another default; the file and the flags still override
// it, and a default outside what the key allows is refused as a value would be.
TEST(Config, AnotherDefaultIsCheckedAndStillOverridden) {
  Config c = Make();
  c.SetDefault("method", "fp32");
  c.SetDefault("cut_layer", "3");
  c.Load("", "test.yaml", {});
  EXPECT_EQ(c.String("method"), "fp32");
  EXPECT_EQ(c.Int("cut_layer"), 3);
  EXPECT_NE(c.Help().find("default fp32"), std::string::npos) << c.Help();
  Config overridden = Make();
  overridden.SetDefault("method", "fp32");
  overridden.Load("method: bf16\n", "test.yaml", {});
  EXPECT_EQ(overridden.String("method"), "bf16");
  Config bad = Make();
  EXPECT_THROW(bad.SetDefault("method", "fp16"), Error);
  EXPECT_THROW(bad.SetDefault("cut_layer", "9"), Error);
  EXPECT_THROW(bad.SetDefault("colour", "red"), Error);
  EXPECT_EQ(bad.String("method"), "bf16") << "a refused default leaves the old one";
}

// Programs log Dump() at start: a token given inline stays out of the log, its file's path does not.
TEST(Config, TheLoggedSettingsHideTokens) {
  Config c = Make();
  c.AddString("token", "", "bearer token");
  c.AddString("token_file", "", "bearer token file");
  c.AddString("admin_token", "", "another secret");
  c.Load("token: s3cret-0123456789abcdef\ntoken_file: /etc/amaq/t\nadmin_token: t0p-s3cret\n", "test.yaml", {});
  const std::string dump = c.Dump();
  EXPECT_EQ(dump.find("s3cret"), std::string::npos) << dump;
  EXPECT_NE(dump.find("token: \"(hidden)\""), std::string::npos) << dump;
  EXPECT_NE(dump.find("token_file: \"/etc/amaq/t\""), std::string::npos) << dump;
  EXPECT_EQ(c.String("token"), "s3cret-0123456789abcdef") << "hidden in the log only";
}

// A list key: a YAML list or one scalar in the file; repeated flags replace the file's list.
// A bare boolean flag may be spelt with dashes, before another flag.
TEST(Config, ListsComeFromTheFileOrRepeatedFlags) {
  Config c = Make();
  c.AddStrings("stop", "stop texts");
  c.AddBool("random_init", false, "random weights");
  c.Load("stop: [\"\\n\\n\", \"User:\"]\n", "test.yaml", {});
  EXPECT_EQ(c.Strings("stop"), (std::vector<std::string>{"\n\n", "User:"}));
  EXPECT_NE(c.Dump().find("stop: [\"\\n\\n\", \"User:\"]"), std::string::npos) << c.Dump();
  c.Load("stop: end\n", "test.yaml", {"--random-init", "--stop", "a", "--stop=b"});
  EXPECT_EQ(c.Strings("stop"), (std::vector<std::string>{"a", "b"})) << "the flags replace the file's list";
  EXPECT_TRUE(c.Bool("random_init"));
  Config none = Make();
  none.AddStrings("stop", "stop texts");
  EXPECT_TRUE(none.Strings("stop").empty());
  EXPECT_NE(none.Help().find("--stop (strings: repeat the flag, or a YAML list, default [])"), std::string::npos) << none.Help();
}

TEST(Config, BadInputNamesTheKeyAndWhatIsAllowed) {
  EXPECT_NE(ErrorOf("colour: red\n", {}).find("unknown key 'colour'"), std::string::npos);
  EXPECT_NE(ErrorOf("cut_layer: two\n", {}).find("'cut_layer' must be an integer"), std::string::npos);
  EXPECT_NE(ErrorOf("cut_layer: 9\n", {}).find("[0, 4]"), std::string::npos);
  EXPECT_NE(ErrorOf("cut_layer: 1.5\n", {}).find("integer"), std::string::npos);
  EXPECT_NE(ErrorOf("method: int8\n", {}).find("allowed: bf16, fp32"), std::string::npos);
  EXPECT_NE(ErrorOf("insecure: maybe\n", {}).find("true or false"), std::string::npos);
  EXPECT_NE(ErrorOf("- a\n- b\n", {}).find("mapping"), std::string::npos);
  EXPECT_NE(ErrorOf("a: [1\n", {}).find("not valid YAML"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--lr"}).find("needs a value"), std::string::npos);
  EXPECT_NE(ErrorOf("", {"--nope", "1"}).find("unknown key 'nope'"), std::string::npos);
  Config unbounded = Make();  // no upper bound: not "[0, 9223372036854775808]" (INT64_MAX as a double)
  unbounded.AddInt("steps", 200, "training steps", 0, INT64_MAX);
  try {
    unbounded.Load("steps: -1\n", "test.yaml", {});
    ADD_FAILURE() << "-1 steps";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'steps' must be an integer of at least 0, got -1"), std::string::npos) << e.what();
  }
}

// Issue 40 item 5: an unclosed quote is reported on its own line (YAML reported the end of the
// file, or took the next keys into the value), a key set twice is refused with both lines.
TEST(Config, AnUnclosedQuoteAndARepeatedKeyAreReportedOnTheirLines) {
  const std::string quote = ErrorOf("method: fp32\nmodel: \"models/x\ncut_layer: 2\nlr: 0.1\n", {});
  EXPECT_NE(quote.find("test.yaml: line 2: a double quote is not closed"), std::string::npos) << quote;
  EXPECT_NE(ErrorOf("model: 'a\n", {}).find("line 1: a single quote"), std::string::npos);
  const std::string twice = ErrorOf("lr: 0.1\nmethod: fp32\nlr: 0.2\n", {});
  EXPECT_NE(twice.find("test.yaml: line 3: 'lr' is set twice (first on line 1)"), std::string::npos) << twice;
  Config c = Make();  // quotes inside comments and plain values, and escaped ones, are characters
  c.Load("model: it's here  # the \"client's\" model\nmethod: \"fp32\"  # it's fp32\n", "test.yaml", {});
  EXPECT_EQ(c.String("model"), "it's here");
  c.Load("model: \"a \\\" b\"\n", "test.yaml", {});
  EXPECT_EQ(c.String("model"), "a \" b");
}

// A missing --config file is a bad setting (exit code 2, docs/configuration.md), named.
TEST(Config, MissingFileIsABadSetting) {
  Config c = Make();
  const char* argv[] = {"prog", "--config", "/nonexistent.yaml"};
  try {
    c.Parse(3, argv);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("/nonexistent.yaml: config file not found"), std::string::npos) << e.what();
  }
}

// common/base/option_keys.h: keys declared once against the fields they set.
struct ToyOptions {
  std::string method = "bf16";
  int64_t steps = 5;
  uint64_t seed = 3;
  double lr = 0.25;
  bool progress = true;
  std::vector<int> sizes = {1, 2};
};

void AddSizes(Config& c, const std::vector<int>& defaults) {
  c.AddInt("first_size", defaults.front(), "the first size", 0, 100);
}
std::vector<int> SizesFrom(const Config& c) { return {static_cast<int>(c.Int("first_size"))}; }

template <typename Keys>
void ToyKeys(Keys& keys) {
  keys.String("method", &ToyOptions::method, "how to compress", {"bf16", "fp32"});
  keys.Int("steps", &ToyOptions::steps, "steps", 0, 100);
  keys.Int("seed", &ToyOptions::seed, "seed", 0, 100);
  keys.Double("lr", &ToyOptions::lr, "learning rate", 0, 1);
  keys.Bool("progress", &ToyOptions::progress, "bar");
  keys.Group(&ToyOptions::sizes, AddSizes, SizesFrom);
}

TEST(OptionKeys, DefaultsComeFromTheStructAndValuesGoBackIntoIt) {
  Config c("amaq-test");
  DeclareOptionKeys<ToyOptions>(c, [](auto& keys) { ToyKeys(keys); });
  EXPECT_NE(c.Help().find("--steps (an integer, default 5)"), std::string::npos) << c.Help();
  EXPECT_NE(c.Help().find("--first_size (an integer, default 1)"), std::string::npos) << c.Help();
  c.Load("lr: 0.5\nseed: 9\n", "test.yaml", {"--method", "fp32", "--first-size", "7"});
  const ToyOptions o = OptionsFrom<ToyOptions>(c, [](auto& keys) { ToyKeys(keys); });
  EXPECT_EQ(o.method, "fp32");
  EXPECT_EQ(o.steps, 5);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);
  EXPECT_TRUE(o.progress);
  EXPECT_EQ(o.sizes, std::vector<int>{7});
}

}  // namespace
}  // namespace amaq
