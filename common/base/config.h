// Config: the settings of one program role (server, client), from a YAML file and the command line.
// Every key is declared once (type, default, help, allowed values) and is both a YAML key and a
// flag `--key value`; a flag overrides the file, the file overrides the default. An unknown key,
// a value of the wrong type or outside what is allowed, or a missing file stops the program with
// an amaq::Error that names the key and what is allowed. docs/configuration.md lists every key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace amaq {

class Config {
 public:
  explicit Config(std::string program) : program_(std::move(program)) {}

  void AddString(const std::string& key, const std::string& fallback, const std::string& help,
                 std::vector<std::string> allowed = {});
  void AddInt(const std::string& key, int64_t fallback, const std::string& help, int64_t min, int64_t max);
  void AddDouble(const std::string& key, double fallback, const std::string& help, double min, double max);
  void AddBool(const std::string& key, bool fallback, const std::string& help);
  // A list of strings: a YAML sequence (or one scalar) in the file; each `--key value` flag adds
  // one, and the flags replace the file's list. Empty by default.
  void AddStrings(const std::string& key, const std::string& help);
  // Gives a key already added another default (a program built on another's keys, as amaq-study
  // on amaq-client's), checked as a value from the file would be. Call it before Parse or Load.
  void SetDefault(const std::string& key, const std::string& text);

  // Reads `--config FILE` (if given) and the other flags. Returns false when --help was asked
  // for (the help has been printed). Throws amaq::Error (kInvalidArgument), a missing --config
  // file included.
  bool Parse(int argc, const char* const* argv);
  // The same from a YAML text and flags, for tests.
  void Load(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& flags);

  std::string String(const std::string& key) const;
  int64_t Int(const std::string& key) const;
  double Double(const std::string& key) const;
  bool Bool(const std::string& key) const;
  bool Has(const std::string& key) const { return entries_.count(key) != 0; }
  std::vector<std::string> Strings(const std::string& key) const;
  // The effective settings as YAML (programs log it at start); a key named token or *_token
  // shows "(hidden)" in place of its value.
  std::string Dump() const;
  std::string Help() const;

 private:
  enum class Type { kString, kInt, kDouble, kBool, kStrings };
  struct Entry {
    Type type;
    std::string value;  // canonical text (kStrings: the items as a YAML flow sequence)
    std::vector<std::string> items;  // kStrings
    std::string help;
    std::vector<std::string> allowed;
    double min = 0, max = 0;
  };
  void Set(const std::string& key, const std::string& text, const std::string& source);
  const Entry& Get(const std::string& key, Type type) const;

  std::string program_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

}  // namespace amaq
