#include "common/text/user_data.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "common/base/error.h"
#include "common/text/utf8.h"

namespace amaq {
namespace {

// One record of a file, by column name, and where it came from ("path:line").
struct Record {
  std::map<std::string, std::string> fields;
  std::string where;
};
using RecordSink = std::function<void(Record)>;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Require(in.good(), ErrorCode::kInvalidArgument, path + ": data file not found: check the path given as train_file or validation_file");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool IsBlank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// Refuses text that is not UTF-8, naming its first bad byte.
void RequireUtf8Data(const std::string& text, const std::string& where) {
  RequireUtf8(text, where, "the file is not UTF-8 (a Latin-1 or Windows-1252 accent is such a byte): save it as UTF-8");
}

bool HasColumns(const std::map<std::string, std::string>& f, const char* a, const char* b) {
  return f.count(a) && f.count(b);
}

// A JSON value as a field: strings as they are, other scalars as JSON writes them (a label 1).
std::string FieldText(const nlohmann::json& value, const std::string& where, const std::string& key) {
  if (value.is_string()) return value.get<std::string>();
  Require(value.is_number() || value.is_boolean(), ErrorCode::kInvalidArgument,
          where + ": \"" + key + "\" must be a string or a number, not " + value.type_name());
  return value.dump();
}

void ReadJsonl(const std::string& path, const RecordSink& sink) {
  std::istringstream in(ReadFile(path));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (IsBlank(line)) continue;
    const std::string where = path + ":" + std::to_string(number);
    RequireUtf8Data(line, where);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      const std::string what = e.what();
      throw Error(ErrorCode::kInvalidArgument, where + ": not a JSON object (" + what.substr(what.find(']') + 2) +
                                                   "): write one {...} per line");
    }
    Require(j.is_object(), ErrorCode::kInvalidArgument, where + ": not a JSON object: write one {...} per line");
    Record record{{}, where};
    for (const auto& [key, value] : j.items()) {
      if (key == "text" || key == "label" || key == "prompt" || key == "completion") {
        record.fields[key] = FieldText(value, where, key);
      }
    }
    sink(std::move(record));
  }
}

// RFC 4180: the first record names the columns.
void ReadCsv(const std::string& path, const RecordSink& sink) {
  const std::string text = ReadFile(path);
  std::vector<std::string> header;
  std::vector<std::string> fields(1);
  int line = 1, record_line = 1;
  bool quoted = false, was_quoted = false;
  const auto end_record = [&] {
    const std::string where = path + ":" + std::to_string(record_line);
    for (const std::string& field : fields) RequireUtf8Data(field, where);
    if (header.empty()) {
      header = fields;
      std::map<std::string, std::string> named;
      std::string names;
      for (const std::string& h : header) {
        named[h];
        names += (names.empty() ? "" : ",") + h;
      }
      Require(IsBlank(names) || HasColumns(named, "text", "label") || HasColumns(named, "prompt", "completion"),
              ErrorCode::kInvalidArgument,
              where + ": the header names the columns " + names +
                  ": name them text,label (classification) or prompt,completion (generation), in lower case");
    } else if (!(fields.size() == 1 && IsBlank(fields[0]))) {
      Require(fields.size() == header.size(), ErrorCode::kInvalidArgument,
              where + ": " + std::to_string(fields.size()) + " fields where the header has " +
                  std::to_string(header.size()) + ": quote a field that holds a comma (\"a, b\")");
      Record record{{}, where};
      for (size_t i = 0; i < header.size(); ++i) record.fields[header[i]] = fields[i];
      sink(std::move(record));
    }
    fields.assign(1, "");
    was_quoted = false;
    record_line = line;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (quoted) {
      if (c != '"') {
        fields.back() += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"') {
      Require(fields.back().empty() && !was_quoted, ErrorCode::kInvalidArgument,
              path + ":" + std::to_string(line) + ": a quote inside an unquoted field: quote the whole field and double the quote (\"say \"\"hi\"\"\")");
      quoted = was_quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
      was_quoted = false;
    } else if (c == '\n') {
      end_record();
    } else if (c != '\r' || i + 1 >= text.size() || text[i + 1] != '\n') {
      Require(!was_quoted, ErrorCode::kInvalidArgument,
              path + ":" + std::to_string(line) + ": text after a closing quote: end the field at the quote");
      fields.back() += c;
    }
  }
  Require(!quoted, ErrorCode::kInvalidArgument,
          path + ":" + std::to_string(record_line) + ": a quoted field is never closed: add the closing \"");
  end_record();
  Require(!header.empty() && !(header.size() == 1 && IsBlank(header[0])), ErrorCode::kInvalidArgument,
          path + ": empty: the first line names the columns (text,label or prompt,completion)");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads one file's examples into `out`, classification or generation as its records say.
void ReadExamples(const std::string& path, Dataset* d, std::map<std::string, int>* label_index, std::vector<Example>* out) {
  const auto add = [&](Record r) {
    auto& f = r.fields;
    Example e;
    if (HasColumns(f, "text", "label")) {
      e.prompt = f["text"] + "\nlabel:";
      e.completion = f["label"];
      Require(!IsBlank(e.completion), ErrorCode::kInvalidArgument, r.where + ": the label is empty: give each example its class");
      const auto [it, added] = label_index->emplace(e.completion, static_cast<int>(d->labels.size()));
      if (added) d->labels.push_back(e.completion);
      e.label = it->second;
    } else if (HasColumns(f, "prompt", "completion")) {
      e.prompt = f["prompt"];
      e.completion = f["completion"];
      Require(!IsBlank(e.completion), ErrorCode::kInvalidArgument, r.where + ": the completion is empty: give each prompt the text to learn");
    } else {
      throw Error(ErrorCode::kInvalidArgument, r.where + ": needs text and label (classification) or prompt and completion (generation)");
    }
    Require(out->empty() || (e.label >= 0) == (out->front().label >= 0), ErrorCode::kInvalidArgument,
            r.where + ": mixes classification and generation examples: use one kind per data set");
    out->push_back(std::move(e));
  };
  if (EndsWith(path, ".jsonl")) {
    ReadJsonl(path, add);
  } else if (EndsWith(path, ".csv")) {
    ReadCsv(path, add);
  } else {
    throw Error(ErrorCode::kInvalidArgument, path + ": unknown data format: name the file .jsonl or .csv (docs/data.md)");
  }
  Require(!out->empty(), ErrorCode::kInvalidArgument, path + ": has no examples: docs/data.md shows the forms");
}

}  // namespace

void RequireUserDataFiles(const std::string& train_path, const std::string& validation_path) {
  Require(!train_path.empty(), ErrorCode::kInvalidArgument, "no training file: set train_file (a .jsonl or .csv file)");
  Require(!validation_path.empty(), ErrorCode::kInvalidArgument,
          "no validation file: set validation_file (a .jsonl or .csv file of examples kept out of training); the client reports its accuracy on it");
}

Dataset LoadUserData(const std::string& train_path, const std::string& validation_path) {
  RequireUserDataFiles(train_path, validation_path);
  Dataset d;
  d.name = std::filesystem::path(train_path).stem().string();
  std::map<std::string, int> label_index;
  ReadExamples(train_path, &d, &label_index, &d.train);
  ReadExamples(validation_path, &d, &label_index, &d.validation);
  Require((d.train.front().label >= 0) == (d.validation.front().label >= 0), ErrorCode::kInvalidArgument,
          validation_path + ": its examples are of another kind than " + train_path + "'s (classification or generation): use one kind per data set");
  return d;
}

}  // namespace amaq
