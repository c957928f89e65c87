// Config keys that set the fields of an options struct, each declared once: its key, the field it
// sets, its help and range. Its default is that field's value in a default-constructed Options,
// so a default lives in one place (the struct) and a key cannot drift from its field.
//
// A program lists its keys in one function template over a visitor:
//
//   template <typename Keys> void ClientOptionKeys(Keys& keys) {
//     keys.String("method", &ClientOptions::method, "how the cut is compressed");
//     keys.Int("steps", &ClientOptions::steps, "training steps", 0, INT64_MAX);
//   }
//
// and runs it twice: DeclareOptionKeys<ClientOptions>(config, list) adds the keys to a Config,
// OptionsFrom<ClientOptions>(config, list) sets an Options from a parsed Config (`list` is a
// generic lambda calling the function template). A field made of several keys (LoRA's) is a Group: a function that
// declares its keys from the field's default and one that reads the field back.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/base/config.h"

namespace amaq {

template <typename Options>
class DeclareKeys {
 public:
  // `config` must outlive this object.
  explicit DeclareKeys(Config& config) : config_(config) {}
  void String(const std::string& key, std::string Options::*field, const std::string& help,
              std::vector<std::string> allowed = {}) {
    config_.AddString(key, defaults_.*field, help, std::move(allowed));
  }
  template <typename Integer>
  void Int(const std::string& key, Integer Options::*field, const std::string& help, int64_t min, int64_t max) {
    config_.AddInt(key, static_cast<int64_t>(defaults_.*field), help, min, max);
  }
  void Double(const std::string& key, double Options::*field, const std::string& help, double min, double max) {
    config_.AddDouble(key, defaults_.*field, help, min, max);
  }
  void Bool(const std::string& key, bool Options::*field, const std::string& help) {
    config_.AddBool(key, defaults_.*field, help);
  }
  template <typename Field>
  void Group(Field Options::*field, void (*declare)(Config&, const Field&), Field (*read)(const Config&)) {
    (void)read;
    declare(config_, defaults_.*field);
  }

 private:
  Config& config_;
  const Options defaults_{};
};

template <typename Options>
class FillKeys {
 public:
  // `config` and `options` must outlive this object.
  FillKeys(const Config& config, Options* options) : config_(config), options_(options) {}
  void String(const std::string& key, std::string Options::*field, const std::string&, std::vector<std::string> = {}) {
    options_->*field = config_.String(key);
  }
  template <typename Integer>
  void Int(const std::string& key, Integer Options::*field, const std::string&, int64_t, int64_t) {
    options_->*field = static_cast<Integer>(config_.Int(key));
  }
  void Double(const std::string& key, double Options::*field, const std::string&, double, double) {
    options_->*field = config_.Double(key);
  }
  void Bool(const std::string& key, bool Options::*field, const std::string&) { options_->*field = config_.Bool(key); }
  template <typename Field>
  void Group(Field Options::*field, void (*declare)(Config&, const Field&), Field (*read)(const Config&)) {
    (void)declare;
    options_->*field = read(config_);
  }

 private:
  const Config& config_;
  Options* options_;
};

template <typename Options, typename KeyList>
void DeclareOptionKeys(Config& config, KeyList list) {
  DeclareKeys<Options> keys(config);
  list(keys);
}

template <typename Options, typename KeyList>
Options OptionsFrom(const Config& config, KeyList list) {
  Options options;
  FillKeys<Options> keys(config, &options);
  list(keys);
  return options;
}

}  // namespace amaq
