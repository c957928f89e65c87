// A user's own data set (common/text/user_data.h): JSONL and CSV read to the same examples, and each
// mistake a user will make answered with the file, the line and what to change.
#include "common/text/user_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/base/error.h"

namespace amaq {
namespace {

class UserData : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message of the error LoadUserData throws, with its code; fails the test when none is thrown.
  std::string ErrorOf(const std::string& train, const std::string& validation, ErrorCode code = ErrorCode::kInvalidArgument) {
    try {
      LoadUserData(train, validation);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error for " << train;
    return "";
  }
  const std::string dir_ = [] {
    const std::string d = ::testing::TempDir() + "/user-data";
    std::filesystem::create_directories(d);
    return d;
  }();
};

TEST_F(UserData, JsonlAndCsvGiveTheSameClassificationExamples) {
  const Dataset jsonl = LoadUserData(Write("cls.jsonl", R"({"text": "great film", "label": "pos", "id": 7})" "\n"
                                                        R"({"text": "dull", "label": "neg"})" "\n\n"
                                                        R"({"text": "fine", "label": "pos"})" "\n"),
                                     Write("cls-val.jsonl", R"({"text": "awful", "label": "neg"})" "\n"));
  // Columns in another order, an ignored column, CRLF line ends; below, a quoted comma, a doubled
  // quote and a field over two lines.
  const Dataset csv = LoadUserData(Write("cls.csv", "id,label,text\r\n1,pos,great film\r\n2,neg,dull\r\n3,pos,fine\r\n"),
                                   Write("cls-val.csv", "text,label\n\"awful\",neg\n"));
  for (const Dataset* d : {&jsonl, &csv}) {
    EXPECT_TRUE(d->is_classification());
    EXPECT_EQ(d->labels, (std::vector<std::string>{"pos", "neg"}));
    ASSERT_EQ(d->train.size(), 3u);
    EXPECT_EQ(d->train[0].prompt, "great film\nlabel:");
    EXPECT_EQ(d->train[2].label, 0);
    ASSERT_EQ(d->validation.size(), 1u);
    EXPECT_EQ(d->validation[0].label, 1);
  }
  const std::string gen = Write("gen.csv", "prompt,completion\n\"Say \"\"hi\"\", twice:\",\"hi\nhi\"\n");
  const Dataset quoted = LoadUserData(gen, gen);
  EXPECT_FALSE(quoted.is_classification());
  ASSERT_EQ(quoted.train.size(), 1u);
  EXPECT_EQ(quoted.train[0].prompt, "Say \"hi\", twice:");
  EXPECT_EQ(quoted.train[0].completion, "hi\nhi");
  const std::string numbered = Write("num.jsonl", R"({"text": "x", "label": 1})" "\n");
  EXPECT_EQ(LoadUserData(numbered, numbered).labels, std::vector<std::string>{"1"});
}

TEST_F(UserData, EachMistakeNamesTheFileTheLineAndTheFix) {
  const std::string valid = Write("valid.jsonl", R"({"text": "x", "label": "y"})" "\n");
  const auto expect = [&](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" missing from: " << message;
  };
  expect(ErrorOf(dir_ + "/absent.jsonl", valid), "absent.jsonl: data file not found");
  expect(ErrorOf(Write("empty.jsonl", "\n\n"), valid), "empty.jsonl: has no examples");
  expect(ErrorOf(Write("empty.csv", ""), valid), "empty.csv: empty: the first line names the columns");
  expect(ErrorOf(Write("header.csv", "text,label\n"), valid), "header.csv: has no examples");
  expect(ErrorOf(Write("bad.jsonl", "{\"text\": \"a\", \"label\": \"b\"}\n{\"text\": \"x\"}\n"), valid),
         "bad.jsonl:2: needs text and label (classification) or prompt and completion");
  expect(ErrorOf(Write("broken.jsonl", "{\"text\": \n"), valid), "broken.jsonl:1: not a JSON object");
  expect(ErrorOf(Write("array.jsonl", "[1, 2]\n"), valid), "array.jsonl:1: not a JSON object");
  expect(ErrorOf(Write("nested.jsonl", "{\"text\": {\"a\": 1}, \"label\": \"b\"}\n"), valid), "nested.jsonl:1: \"text\" must be a string");
  expect(ErrorOf(Write("columns.csv", "text,label\nhello, world,pos\n"), valid), "columns.csv:2: 3 fields where the header has 2");
  expect(ErrorOf(Write("open.csv", "text,label\n\"never closed,pos\n"), valid), "open.csv:2: a quoted field is never closed");
  expect(ErrorOf(Write("inner.csv", "text,label\nsay \"hi\",pos\n"), valid), "inner.csv:2: a quote inside an unquoted field");
  expect(ErrorOf(Write("after.csv", "text,label\n\"hi\"x,pos\n"), valid), "after.csv:2: text after a closing quote");
  expect(ErrorOf(Write("nolabel.csv", "text,label\nhello,\n"), valid), "nolabel.csv:2: the label is empty");
  expect(ErrorOf(Write("mixed.jsonl", "{\"text\": \"a\", \"label\": \"b\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n"), valid),
         "mixed.jsonl:2: mixes classification and generation");
  expect(ErrorOf(Write("train.csv", "text,label\na,b\n"), Write("val.csv", "prompt,completion\np,c\n")),
         "val.csv: its examples are of another kind than");
  expect(ErrorOf(Write("data.tsv", "text\tlabel\n"), valid), "data.tsv: unknown data format: name the file .jsonl or .csv");
  expect(ErrorOf("", valid), "no training file: set train_file");
  expect(ErrorOf(valid, ""), "no validation file: set validation_file");
  expect(ErrorOf(valid, dir_ + "/absent.csv"), "absent.csv: data file not found");
  // Issue 55 item 5: bytes that are not UTF-8 (accepted in CSV, "not a JSON object" in JSONL), a
  // misspelled header (reported at line 2), JSON's own reason.
  expect(ErrorOf(Write("latin1.csv", "text,label\ncaf\xe9,pos\n"), valid),
         "latin1.csv:2: byte 3 (0xE9) begins no valid UTF-8 character (");
  expect(ErrorOf(Write("latin1.jsonl", "{\"text\": \"caf\xe9\", \"label\": \"b\"}\n"), valid),
         "latin1.jsonl:1: byte 13 (0xE9) begins no valid UTF-8 character (");
  expect(ErrorOf(Write("latin1-end.csv", "text,label\nhi,caf\xe9\n"), valid), "): the file is not UTF-8");
  expect(ErrorOf(Write("misspelled.csv", "txt,label\nhello,pos\n"), valid),
         "misspelled.csv:1: the header names the columns txt,label: name them text,label (classification) or "
         "prompt,completion");
  expect(ErrorOf(Write("comma.jsonl", "{\"text\": \"a\", \"label\": \"b\",}\n"), valid),
         "comma.jsonl:1: not a JSON object (parse error at line 1, column 28: syntax error");
}

}  // namespace
}  // namespace amaq
