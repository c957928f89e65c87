#include "common/base/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iomanip>
#include <sstream>

#include "common/base/error.h"

namespace amaq {
namespace {

const char* TypeName(int type) {
  static const char* names[] = {"a string", "an integer", "a number", "true or false", "strings: repeat the flag, or a YAML list"};
  return names[type];
}

std::string Join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

// Items as a YAML flow sequence of double-quoted strings: ["a", "say \"hi\""].
std::string FlowSequence(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += i ? ", \"" : "\"";
    for (const char c : items[i]) out += c == '"' || c == '\\' ? std::string("\\") + c : c == '\n' ? std::string("\\n") : std::string(1, c);
    out += "\"";
  }
  return out + "]";
}

}  // namespace

void Config::AddStrings(const std::string& key, const std::string& help) {
  entries_[key] = Entry{Type::kStrings, "[]", {}, help, {}};
  order_.push_back(key);
}

void Config::SetDefault(const std::string& key, const std::string& text) { Set(key, text, program_ + "'s default"); }

void Config::AddString(const std::string& key, const std::string& fallback, const std::string& help,
                       std::vector<std::string> allowed) {
  entries_[key] = Entry{Type::kString, fallback, {}, help, std::move(allowed)};
  order_.push_back(key);
}

void Config::AddInt(const std::string& key, int64_t fallback, const std::string& help, int64_t min, int64_t max) {
  entries_[key] = Entry{Type::kInt, std::to_string(fallback), {}, help, {}, static_cast<double>(min), static_cast<double>(max)};
  order_.push_back(key);
}

void Config::AddDouble(const std::string& key, double fallback, const std::string& help, double min, double max) {
  std::ostringstream text;
  text << fallback;
  entries_[key] = Entry{Type::kDouble, text.str(), {}, help, {}, min, max};
  order_.push_back(key);
}

void Config::AddBool(const std::string& key, bool fallback, const std::string& help) {
  entries_[key] = Entry{Type::kBool, fallback ? "true" : "false", {}, help, {}};
  order_.push_back(key);
}

void Config::Set(const std::string& key, const std::string& text, const std::string& source) {
  const auto it = entries_.find(key);
  Require(it != entries_.end(), ErrorCode::kInvalidArgument,
          source + ": unknown key '" + key + "' for " + program_ + " (run with --help for the keys)");
  Entry& e = it->second;
  const std::string where = source + ": '" + key + "' must be " + TypeName(static_cast<int>(e.type));
  switch (e.type) {
    case Type::kStrings:
      e.items.push_back(text);
      e.value = FlowSequence(e.items);
      return;
    case Type::kString:
      Require(e.allowed.empty() || std::find(e.allowed.begin(), e.allowed.end(), text) != e.allowed.end(),
              ErrorCode::kInvalidArgument,
              source + ": '" + key + "' is '" + text + "'; allowed: " + Join(e.allowed));
      e.value = text;
      return;
    case Type::kBool:
      Require(text == "true" || text == "false", ErrorCode::kInvalidArgument, where + ", got '" + text + "'");
      e.value = text;
      return;
    case Type::kInt:
    case Type::kDouble: {
      double v = 0;
      size_t used = 0;
      try {
        v = std::stod(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      Require(used == text.size() && !text.empty() && std::isfinite(v) &&
                  (e.type == Type::kDouble || v == std::floor(v)),
              ErrorCode::kInvalidArgument, where + ", got '" + text + "'");
      std::ostringstream range;
      if (e.type == Type::kInt) range << std::fixed << std::setprecision(0);  // 1048576, not 1.04858e+06
      if (e.type == Type::kInt && e.max >= static_cast<double>(INT64_MAX)) {
        range << " of at least " << e.min;  // not "[0, 9223372036854775808]": INT64_MAX as a double
      } else {
        range << " in [" << e.min << ", " << e.max << "]";
      }
      Require(v >= e.min && v <= e.max, ErrorCode::kInvalidArgument, where + range.str() + ", got " + text);
      e.value = text;
      return;
    }
  }
}

namespace {

// Each key: value is one line: a quote left open would run into the next lines, where YAML reports
// it at the end of the file, or swallows the keys after it into one value. Names the line.
void RequireQuotesClosePerLine(const std::string& yaml_text, const std::string& source) {
  int line = 1;
  size_t start = 0;
  while (start <= yaml_text.size()) {
    const size_t end = std::min(yaml_text.find('\n', start), yaml_text.size());
    char quote = 0;
    for (size_t i = start; i < end; ++i) {
      const char ch = yaml_text[i];
      if (quote == '"' && ch == '\\') {
        ++i;  // an escaped character inside double quotes
      } else if (quote != 0) {
        if (ch == quote) quote = 0;  // '' inside single quotes closes and reopens: balanced either way
      } else if (ch == '#' && (i == start || yaml_text[i - 1] == ' ' || yaml_text[i - 1] == '\t')) {
        break;  // a comment
      } else if (ch == '"' || ch == '\'') {
        // A quote opens a quoted scalar only where a value starts (an apostrophe inside a plain
        // value, as in client's, is a character).
        size_t before = i;
        while (before > start && (yaml_text[before - 1] == ' ' || yaml_text[before - 1] == '\t')) --before;
        if (before == start || std::string(":-[{,").find(yaml_text[before - 1]) != std::string::npos) quote = ch;
      }
    }
    Require(quote == 0, ErrorCode::kInvalidArgument,
            source + ": line " + std::to_string(line) + ": a " + (quote == '"' ? "double" : "single") +
                " quote is not closed on its line: close it (each key: value is one line)");
    start = end + 1;
    ++line;
  }
}

}  // namespace

void Config::Load(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& flags) {
  if (!yaml_text.empty()) {
    RequireQuotesClosePerLine(yaml_text, source);
    YAML::Node root;
    try {
      root = YAML::Load(yaml_text);
    } catch (const YAML::Exception& e) {
      throw Error(ErrorCode::kInvalidArgument, source + ": not valid YAML (" + e.what() + ")");
    }
    Require(root.IsMap() || root.IsNull(), ErrorCode::kInvalidArgument,
            source + ": must be a mapping of key: value lines");
    std::map<std::string, int> line_of;
    for (const auto& item : root) {
      const std::string key = item.first.as<std::string>();
      const int line = item.first.Mark().line + 1;
      const auto [first, fresh] = line_of.emplace(key, line);
      Require(fresh, ErrorCode::kInvalidArgument,
              source + ": line " + std::to_string(line) + ": '" + key + "' is set twice (first on line " +
                  std::to_string(first->second) + "): keep one");
      const auto entry = entries_.find(key);
      if (entry != entries_.end() && entry->second.type == Type::kStrings && item.second.IsSequence()) {
        for (const auto& value : item.second) {
          Require(value.IsScalar(), ErrorCode::kInvalidArgument, source + ": '" + key + "' must be a list of strings");
          Set(key, value.as<std::string>(), source);
        }
        continue;
      }
      Require(item.second.IsScalar(), ErrorCode::kInvalidArgument,
              source + ": '" + key + "' must be a single value, not a list or mapping");
      Set(key, item.second.as<std::string>(), source);
    }
  }
  std::set<std::string> listed_by_flags;
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& flag = flags[i];
    Require(flag.rfind("--", 0) == 0 && flag.size() > 2, ErrorCode::kInvalidArgument,
            "command line: expected --key value, got '" + flag + "'");
    std::string key = flag.substr(2), value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    std::replace(key.begin(), key.end(), '-', '_');
    if (eq == std::string::npos) {
      const auto it = entries_.find(key);
      const bool is_bool = it != entries_.end() && it->second.type == Type::kBool;
      if (is_bool && (i + 1 == flags.size() || flags[i + 1].rfind("--", 0) == 0)) {
        value = "true";  // a bare boolean flag
      } else {
        Require(i + 1 < flags.size(), ErrorCode::kInvalidArgument, "command line: --" + key + " needs a value");
        value = flags[++i];
      }
    }
    const auto entry = entries_.find(key);
    if (entry != entries_.end() && entry->second.type == Type::kStrings && listed_by_flags.insert(key).second) {
      entry->second.items.clear();  // the flags' list replaces the file's
    }
    Set(key, value, "command line");
  }
}

bool Config::Parse(int argc, const char* const* argv) {
  std::vector<std::string> flags;
  std::string file;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << Help();
      return false;
    }
    if (arg == "--config") {
      Require(i + 1 < argc, ErrorCode::kInvalidArgument, "command line: --config needs a file");
      file = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      file = arg.substr(9);
    } else {
      flags.push_back(arg);
    }
  }
  std::string text;
  if (!file.empty()) {
    std::ifstream in(file);
    Require(in.good(), ErrorCode::kInvalidArgument, file + ": config file not found (given by --config): check the path");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  Load(text, file.empty() ? "config" : file, flags);
  return true;
}

const Config::Entry& Config::Get(const std::string& key, Type type) const {
  const auto it = entries_.find(key);
  Require(it != entries_.end() && it->second.type == type, ErrorCode::kInternal,
          program_ + " reads undeclared config key '" + key + "'");
  return it->second;
}

std::string Config::String(const std::string& key) const { return Get(key, Type::kString).value; }
int64_t Config::Int(const std::string& key) const { return std::stoll(Get(key, Type::kInt).value); }
double Config::Double(const std::string& key) const { return std::stod(Get(key, Type::kDouble).value); }
bool Config::Bool(const std::string& key) const { return Get(key, Type::kBool).value == "true"; }
std::vector<std::string> Config::Strings(const std::string& key) const { return Get(key, Type::kStrings).items; }

std::string Config::Dump() const {
  std::string out;
  for (const std::string& key : order_) {
    const Entry& e = entries_.at(key);
    // A secret given inline (the client's token) never reaches a log: its *_file keys are paths.
    const bool secret = (key == "token" || (key.size() > 6 && key.compare(key.size() - 6, 6, "_token") == 0)) && !e.value.empty();
    out += key + ": " + (secret ? "\"(hidden)\"" : e.type == Type::kString ? "\"" + e.value + "\"" : e.value) + "\n";
  }
  return out;
}

std::string Config::Help() const {
  std::string out = "usage: " + program_ + " [--config FILE.yaml] [--key value ...]\n\nkeys (YAML or flags):\n";
  for (const std::string& key : order_) {
    const Entry& e = entries_.at(key);
    out += "  --" + key + " (" + TypeName(static_cast<int>(e.type)) + ", default " + e.value + ")\n      " + e.help;
    if (!e.allowed.empty()) out += " [" + Join(e.allowed) + "]";
    out += "\n";
  }
  return out;
}

}  // namespace amaq
