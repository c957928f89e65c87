#include "server/session_store.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/base/atomic_file.h"
#include "common/base/error.h"
#include "common/model/archive_check.h"
#include "quant/checksum.h"

namespace amaq::server {
namespace {

// The name of a client's files: the XXH3 of its id, which may hold any character.
std::string FileName(const std::string& client_id) {
  char name[17];
  std::snprintf(name, sizeof name, "%016llx",
                static_cast<unsigned long long>(quant::WireChecksum(reinterpret_cast<const uint8_t*>(client_id.data()), client_id.size())));
  return name;
}

std::string SessionsDir(const ServerOptions& o) { return o.checkpoint_dir + "/sessions"; }
std::string HistoriesDir(const ServerOptions& o) { return o.checkpoint_dir + "/histories"; }

uint64_t Bytes(const torch::Tensor& t) { return t.defined() ? static_cast<uint64_t>(t.nbytes()) : 0; }

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

// A torch archive written atomically through `env`.
void WriteArchive(torch::serialize::OutputArchive& archive, const std::string& path, Env& env) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  WriteFileAtomically(path, bytes.str(), &env);
}

void SaveLora(torch::serialize::OutputArchive& archive, const std::string& prefix, const LoraState& lora) {
  for (size_t i = 0; i < lora.values.size(); ++i) archive.write(prefix + ".lora." + std::to_string(i), lora.values[i].to(torch::kCPU));
  torch::serialize::OutputArchive opt;
  lora.optimizer->save(opt);
  archive.write(prefix + ".optimizer", opt);
}

void LoadLora(torch::serialize::InputArchive& archive, const std::string& prefix, LoraState& lora) {
  for (size_t i = 0; i < lora.values.size(); ++i) {
    torch::Tensor t;
    archive.read(prefix + ".lora." + std::to_string(i), t);
    torch::NoGradGuard no_grad;
    lora.values[i].copy_(t);
  }
  torch::serialize::InputArchive opt;
  archive.read(prefix + ".optimizer", opt);
  lora.optimizer->load(opt);
}

// Collaborative mode: each client's latest adapter upload, so that an average after a restart
// still covers the clients that synced before it.
void SaveUploads(torch::serialize::OutputArchive& archive, const std::map<std::string, NamedFloats>& uploads) {
  std::string uploaders;
  for (const auto& [id, tensors] : uploads) {
    uploaders += id + "\n";
    std::string names;
    int64_t i = 0;
    for (const auto& [name, t] : tensors) {
      names += name + "\n";
      archive.write("adapter." + id + "." + std::to_string(i++), torch::tensor(t.values).view(t.shape));
    }
    archive.write("adapter." + id + ".names", c10::IValue(names));
  }
  archive.write("adapter_clients", c10::IValue(uploaders));
}

void LoadUploads(torch::serialize::InputArchive& archive, std::map<std::string, NamedFloats>& uploads) {
  c10::IValue uploaders;
  if (!archive.try_read("adapter_clients", uploaders)) return;  // absent from checkpoints of older servers
  std::istringstream uploader_ids(uploaders.toStringRef());
  for (std::string id; std::getline(uploader_ids, id);) {
    c10::IValue names;
    archive.read("adapter." + id + ".names", names);
    std::istringstream lines(names.toStringRef());
    NamedFloats tensors;
    int64_t i = 0;
    for (std::string name; std::getline(lines, name);) {
      torch::Tensor t;
      archive.read("adapter." + id + "." + std::to_string(i++), t);
      t = t.to(torch::kFloat).contiguous();
      tensors[name] = NamedFloat{t.sizes().vec(), std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel())};
    }
    uploads[id] = std::move(tensors);
  }
}

}  // namespace

SessionStore::SessionStore(const ServerOptions& options, const ModelConfig& config, std::vector<torch::Tensor> initial_lora)
    : options_(options), config_(config), env_(*options.env), initial_lora_(std::move(initial_lora)) {
  if (options_.shared_lora) shared_ = NewLoraState();
  Require(options_.session_ttl_seconds <= 0 || !options_.checkpoint_dir.empty(), ErrorCode::kInvalidArgument,
          "session_ttl_seconds is set without a checkpoint_dir: evicted sessions are kept there; set checkpoint_dir, "
          "or session_ttl_seconds: 0");
  if (options_.checkpoint_dir.empty()) return;
  RequireWritableDirectory(options_.checkpoint_dir, "checkpoint_dir", &env_);
  try {
    lock_ = env_.LockFile(options_.checkpoint_dir + "/LOCK", "amaq-server pid " + std::to_string(getpid()));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFailedPrecondition) throw;
    throw Error(ErrorCode::kInvalidArgument, "checkpoint_dir " + options_.checkpoint_dir + " is in use (" + e.what() +
                                                 "): two servers on one checkpoint_dir overwrite each other's checkpoints; "
                                                 "give this server its own checkpoint_dir, or stop the other first");
  }
  if (env_.FileExists(CheckpointPath())) LoadCheckpoint();
}

SessionStore::~SessionStore() = default;

std::unique_ptr<LoraState> SessionStore::NewLoraState() const {
  auto lora = std::make_unique<LoraState>();
  for (const auto& t : initial_lora_) lora->values.push_back(t.clone().requires_grad_(true));
  lora->optimizer = std::make_unique<torch::optim::AdamW>(lora->values, torch::optim::AdamWOptions(options_.lr).weight_decay(0.0));
  return lora;
}

quant::CodecContext SessionStore::CodecContextFor(const std::string& client_id) const {
  quant::CodecContext context;
  context.channels = config_.hidden_size;
  context.settings = options_.method_settings;
  context.instance = FileName(client_id);
  if (!options_.checkpoint_dir.empty()) context.history_stem = HistoriesDir(options_) + "/" + context.instance;
  context.env = &env_;
  return context;
}

std::optional<int64_t> SessionStore::JoinAbsent(const std::string& client_id, const quant::Method& method,
                                                const std::string& run, RunStart start) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sessions_.count(client_id)) return std::nullopt;
  return JoinLocked(client_id, method, run, start);  // a session not in memory is in no step
}

int64_t SessionStore::Join(const std::string& client_id, const quant::Method& method, const std::string& run, RunStart start) {
  std::lock_guard<std::mutex> lock(mutex_);
  return JoinLocked(client_id, method, run, start);
}

int64_t SessionStore::JoinLocked(const std::string& client_id, const quant::Method& method, const std::string& run,
                                 RunStart start) {
  const std::string canonical = method.ToString();
  auto it = sessions_.find(client_id);
  if (it == sessions_.end()) {
    std::unique_ptr<Session> session = LoadEvicted(client_id);
    if (!session) {
      session = std::make_unique<Session>();
      session->client_id = client_id;
      if (!options_.shared_lora) session->own = NewLoraState();
    }
    it = sessions_.emplace(client_id, std::move(session)).first;
  }
  Session& s = *it->second;
  s.last_seen = env_.Now();
  if (!run.empty() && !s.run.empty() && s.run != run && start == RunStart::kContinue) {
    throw Error(ErrorCode::kFailedPrecondition,
                "client " + client_id + ": the server holds another run of this client (" + std::to_string(s.stats.steps) +
                    " steps applied): " + RunMismatch(s.run, run) + "; or use another client_id");
  }
  Require(s.method_text.empty() || s.method_text == canonical, ErrorCode::kInvalidArgument,
          "client " + client_id + " trained with method " + s.method_text + " and now asks for " + canonical +
              ": keep the method, set fresh: true to discard the stored run, or use a new client_id");
  if (!run.empty()) s.run = run;
  if (!s.codec) s.codec = method.MakeServerCodec(CodecContextFor(client_id));
  s.method_text = canonical;
  s.codec->Reset();  // a (re)joining client starts fresh codec streams; AQ-SGD caches survive
  s.decode_cache.reset();
  PublishLocked(s);
  // Counted as the client counts (steps done), not by the last step's id, which is one less.
  spdlog::info("client {} joined: method {}, {} steps applied", client_id, s.method_text, s.last_applied + 1);
  return s.last_applied;
}

bool SessionStore::Forget(const std::string& client_id) {
  bool had = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sessions_.find(client_id);
    const int64_t steps = it == sessions_.end() ? 0 : it->second->stats.steps;
    had = it != sessions_.end();
    if (had) sessions_.erase(it);
    published_.erase(client_id);
    if (!options_.checkpoint_dir.empty()) {
      had = env_.RemoveFile(EvictedPath(client_id)) || had;
      // The method's history: its files are named after the client, with an extension of the method's.
      for (const std::string& name : env_.GetChildren(HistoriesDir(options_))) {
        if (name.rfind(FileName(client_id) + ".", 0) == 0) had = env_.RemoveFile(HistoriesDir(options_) + "/" + name) || had;
      }
    }
    if (had) spdlog::info("client {}: a fresh run: its stored session ({} steps applied) is discarded", client_id, steps);
  }
  if (had) Checkpoint();  // the last checkpoint still holds what was discarded
  return had;
}

Session& SessionStore::Joined(const std::string& client_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = sessions_.find(client_id);
  Require(it != sessions_.end() && !it->second->method_text.empty(), ErrorCode::kFailedPrecondition,
          "client " + client_id + " has not joined, or its session was evicted after session_ttl_seconds idle: call Join "
          "(it resumes an evicted session)");
  it->second->last_seen = env_.Now();
  return *it->second;
}

void SessionStore::PublishLocked(const Session& s) {
  ClientStats& shown = published_[s.client_id];
  shown = s.stats;
  shown.method = s.method_text;
}

void SessionStore::Publish(const std::vector<const Session*>& sessions) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Session* s : sessions) PublishLocked(*s);
  uint64_t bytes = 0;
  for (const auto& [id, s] : sessions_) bytes += SessionBytes(*s);
  memory_bytes_ = bytes;
}

std::map<std::string, ClientStats> SessionStore::Stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return published_;
}

size_t SessionStore::in_memory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sessions_.size();
}

uint64_t SessionStore::HeldBytes(const KvCache* cache) {
  if (!cache) return 0;
  uint64_t total = Bytes(cache->seen);
  for (const LayerKv& layer : cache->layers) total += Bytes(layer.keys) + Bytes(layer.values);
  return total;
}

uint64_t SessionStore::SessionBytes(const Session& s) {
  uint64_t total = (s.codec ? s.codec->memory_bytes() : 0) + HeldBytes(s.decode_cache.get());
  for (const Session::Answers& a : s.applied) {
    for (const torch::Tensor& g : a.gradients) total += Bytes(g);
  }
  for (const torch::Tensor& g : s.partial_gradients) total += Bytes(g);
  if (s.own) {
    for (const torch::Tensor& v : s.own->values) total += 3 * Bytes(v);  // the values and AdamW's two moments
  }
  return total;
}

void SessionStore::KeepWithinBudget(const std::set<std::string>& batch, const Session& s, const StepInput& in, uint64_t adds) {
  if (options_.max_sessions_memory_mb <= 0) return;
  const auto budget = static_cast<uint64_t>(options_.max_sessions_memory_mb * (1 << 20));
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t total = 0, movable = 0;
  std::vector<std::pair<Clock::time_point, std::string>> others;  // sessions that may move to disk
  for (const auto& [id, other] : sessions_) {
    const uint64_t bytes = SessionBytes(*other);
    total += bytes;
    if (!batch.count(id) && other->partial_step < 0) {  // not amid a step sent in parts
      others.emplace_back(other->last_seen, id);
      movable += bytes;
    }
  }
  if (total + adds <= budget) return;
  std::sort(others.begin(), others.end());
  const std::string over = "the server's sessions hold " + MiB(total) + " and step " + std::to_string(in.step_id) +
                           " of client " + s.client_id + " adds about " + MiB(adds) + ", over max_sessions_memory_mb (" +
                           MiB(budget) + ")";
  Require(!options_.checkpoint_dir.empty(), ErrorCode::kResourceExhausted,
          over + ", and without checkpoint_dir no session can move to disk: raise max_sessions_memory_mb or set checkpoint_dir "
                 "(the step was not applied; send it again later)");
  Require(total - movable + adds <= budget, ErrorCode::kResourceExhausted,
          over + " even with every other session on disk: raise max_sessions_memory_mb, or send fewer rows or shorter "
                 "sequences (the step was not applied)");
  for (size_t i = 0; total + adds > budget; ++i) {
    total -= SessionBytes(*sessions_.at(others[i].second));
    EvictLocked(others[i].second, "to keep max_sessions_memory_mb");
  }
  lock.unlock();
  TryCheckpoint();  // without them (until it succeeds, their files are the newer state)
}

int SessionStore::EvictIdle(const std::set<std::string>& connected) {
  if (options_.session_ttl_seconds <= 0) return 0;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto now = env_.Now();
  std::vector<std::string> idle;
  for (const auto& [id, s] : sessions_) {
    if (!connected.count(id) && std::chrono::duration<double>(now - s->last_seen).count() >= options_.session_ttl_seconds) {
      idle.push_back(id);
    }
  }
  if (idle.empty()) return 0;
  for (const std::string& id : idle) EvictLocked(id, "after " + std::to_string(options_.session_ttl_seconds) + " s idle");
  lock.unlock();
  Checkpoint();  // without them: their files are the newer state
  return static_cast<int>(idle.size());
}

void SessionStore::EvictLocked(const std::string& id, const std::string& why) {
  env_.CreateDirs(SessionsDir(options_));
  torch::serialize::OutputArchive archive;
  archive.write("client", c10::IValue(id));
  SaveSession(archive, *sessions_.at(id));
  WriteArchive(archive, EvictedPath(id), env_);
  sessions_.erase(id);
  published_.erase(id);
  ++evicted_;
  spdlog::info("client {}: session evicted {} (kept in {})", id, why, EvictedPath(id));
}

std::vector<const NamedFloats*> SessionStore::StoreUpload(const std::string& client_id, const NamedFloats& tensors) {
  uploads_[client_id] = tensors;
  std::vector<const NamedFloats*> all;
  for (const auto& [id, upload] : uploads_) all.push_back(&upload);
  return all;
}

void SessionStore::CheckpointIfDue() {
  if (applied_since_checkpoint_ >= options_.checkpoint_every) TryCheckpoint();
}

void SessionStore::TryCheckpoint() {
  // A failed checkpoint between steps (disk full, folder gone) must not fail the step: the previous
  // checkpoint stays, the error is logged and counted, and the next step tries again. Checkpoint()
  // (at shutdown) does throw. While checkpoints fail, the log says so once a minute, not every step.
  try {
    Checkpoint();
    if (checkpoints_failing_) spdlog::info("checkpoints are written again, after {} failed", checkpoint_failures_.load());
    checkpoints_failing_ = false;
  } catch (const Error& e) {
    ++checkpoint_failures_;
    const Clock::time_point now = env_.Now();
    if (checkpoints_failing_ && now - last_failure_logged_ < std::chrono::minutes(1)) return;
    checkpoints_failing_ = true;
    last_failure_logged_ = now;
    spdlog::error("checkpoint failed ({} failures so far; retrying after each step, this message once a minute): {}",
                  checkpoint_failures_.load(), e.what());
  }
}

void SessionStore::Checkpoint() {
  if (options_.checkpoint_dir.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);  // a first Join waits: the map is walked
  torch::serialize::OutputArchive archive;
  std::string clients;
  for (const auto& [id, s] : sessions_) {
    clients += id + "\n";
    SaveSession(archive, *s);
  }
  archive.write("clients", c10::IValue(clients));
  SaveUploads(archive, uploads_);
  if (shared_) SaveLora(archive, "shared", *shared_);
  try {
    WriteArchive(archive, CheckpointPath(), env_);
  } catch (const Error& e) {
    throw Error(e.code(), std::string(e.what()) + "; the checkpoint kept lacks the last " +
                              std::to_string(applied_since_checkpoint_) +
                              " applied steps: if the server stops now, its clients send them again after the restart, "
                              "computed with their newer weights (free space in checkpoint_dir)");
  }
  applied_since_checkpoint_ = 0;
  // The checkpoint now holds every session in memory: an evicted copy of one is out of date.
  for (const auto& [id, s] : sessions_) env_.RemoveFile(EvictedPath(id));
}

void SessionStore::SaveSession(torch::serialize::OutputArchive& archive, Session& s) const {
  const std::string key = "client." + s.client_id;
  archive.write(key + ".method", c10::IValue(s.method_text));
  archive.write(key + ".run", c10::IValue(s.run));
  archive.write(key + ".last_applied", torch::tensor(s.last_applied));
  archive.write(key + ".applied_steps", torch::tensor(s.stats.steps));
  if (s.own) SaveLora(archive, key, *s.own);
  SaveAnswers(archive, key, s);
  if (s.codec) s.codec->SaveHistory();  // a file of its own, of any age: safe with the checkpoint before or after it
}

std::unique_ptr<Session> SessionStore::LoadSession(torch::serialize::InputArchive& archive, const std::string& id) const {
  auto s = std::make_unique<Session>();
  s->client_id = id;
  s->last_seen = env_.Now();
  const std::string key = "client." + id;
  c10::IValue method;
  archive.read(key + ".method", method);
  s->method_text = method.toStringRef();
  c10::IValue run;
  if (archive.try_read(key + ".run", run)) s->run = run.toStringRef();  // absent from checkpoints before runs
  s->codec = quant::Method::Parse(s->method_text)->MakeServerCodec(CodecContextFor(id));
  try {
    s->codec->LoadHistory();
  } catch (const Error& e) {  // it only saves bytes: the client sends the samples in full again
    spdlog::warn("client {}: {}; continuing without it", id, e.what());
  }
  torch::Tensor last;
  archive.read(key + ".last_applied", last);
  s->last_applied = last.item<int64_t>();
  torch::Tensor applied;
  archive.read(key + ".applied_steps", applied);
  s->stats.steps = applied.item<int64_t>();
  if (!options_.shared_lora) {
    s->own = NewLoraState();
    LoadLora(archive, key, *s->own);
  }
  LoadAnswers(archive, key, *s);
  return s;
}

// The stored answers are kept in checkpoints: a client killed before its own checkpoint held a
// step sends it again, and gets the same gradient from a restarted server as from this one.
void SessionStore::SaveAnswers(torch::serialize::OutputArchive& archive, const std::string& key, const Session& s) {
  for (size_t j = 0; j < s.applied.size(); ++j) {
    const Session::Answers& a = s.applied[j];
    const std::string answers = key + ".answers." + std::to_string(j);
    std::vector<double> numbers;  // per part: loss, average bits, server seconds
    for (const StepResult& r : a.replies) numbers.insert(numbers.end(), {r.loss, r.average_bits, r.server_seconds});
    archive.write(answers + ".step", torch::tensor(a.step));
    archive.write(answers + ".numbers", torch::tensor(numbers, torch::kDouble));
    for (size_t p = 0; p < a.gradients.size(); ++p) archive.write(answers + ".gradient." + std::to_string(p), a.gradients[p]);
  }
}

void SessionStore::LoadAnswers(torch::serialize::InputArchive& archive, const std::string& key, Session& s) const {
  for (int j = 0;; ++j) {  // the stored answers (absent from checkpoints before they were kept)
    const std::string answers = key + ".answers." + std::to_string(j);
    torch::Tensor step, numbers;
    if (!archive.try_read(answers + ".step", step)) break;
    archive.read(answers + ".numbers", numbers);
    Require(numbers.dim() == 1 && numbers.size(0) % 3 == 0, ErrorCode::kDataLoss,
            "client " + s.client_id + ": the checkpoint's stored answers are malformed: move the checkpoint away to start fresh");
    Session::Answers a{step.item<int64_t>(), {}, {}};
    for (int64_t p = 0; p < numbers.size(0) / 3; ++p) {
      StepResult r;
      r.step_id = a.step;
      r.duplicate = true;
      r.loss = static_cast<float>(numbers[3 * p].item<double>());
      r.average_bits = numbers[3 * p + 1].item<double>();
      r.server_seconds = numbers[3 * p + 2].item<double>();
      a.replies.push_back(r);
      torch::Tensor g;
      archive.read(answers + ".gradient." + std::to_string(p), g);
      Require(g.scalar_type() == torch::kFloat && g.dim() == 2 && g.size(1) == config_.hidden_size, ErrorCode::kDataLoss,
              "client " + s.client_id + ": a stored answer's gradient in the checkpoint is not [rows, " +
                  std::to_string(config_.hidden_size) + "] fp32: move the checkpoint away to start fresh");
      a.gradients.push_back(g.contiguous());
    }
    s.applied.push_back(std::move(a));
  }
}

std::string SessionStore::CheckpointPath() const { return options_.checkpoint_dir + "/server.pt"; }

std::string SessionStore::EvictedPath(const std::string& client_id) const {
  return SessionsDir(options_) + "/" + FileName(client_id) + ".pt";
}

std::unique_ptr<Session> SessionStore::LoadEvicted(const std::string& client_id) const {
  if (options_.checkpoint_dir.empty()) return nullptr;
  const std::string path = EvictedPath(client_id);
  if (!env_.FileExists(path)) return nullptr;
  torch::serialize::InputArchive archive;
  ReadArchive(env_, path, "the evicted session of client " + client_id, archive);
  RequireFiniteArchive(archive, path);
  c10::IValue id;
  Require(archive.try_read("client", id) && id.isString(), ErrorCode::kDataLoss,
          path + ": the evicted session names no client: move it away to start client " + client_id + " fresh");
  if (id.toStringRef() != client_id) return nullptr;  // another id with the same hash: that client is not this one
  spdlog::info("client {}: resuming its evicted session from {}", client_id, path);
  return LoadSession(archive, client_id);
}

void SessionStore::LoadCheckpoint() {
  const std::string path = CheckpointPath();
  torch::serialize::InputArchive archive;
  ReadArchive(env_, path, "server checkpoint", archive);
  RequireFiniteArchive(archive, path);
  c10::IValue clients;
  archive.read("clients", clients);
  std::istringstream ids(clients.toStringRef());
  for (std::string id; std::getline(ids, id);) {
    std::unique_ptr<Session> s = LoadSession(archive, id);
    // A session evicted after this checkpoint was written: its file is the newer state.
    std::unique_ptr<Session> evicted = LoadEvicted(id);
    if (evicted && evicted->stats.steps > s->stats.steps) continue;
    PublishLocked(*s);  // the constructor's: nothing else runs yet
    sessions_.emplace(id, std::move(s));
  }
  if (shared_) LoadLora(archive, "shared", *shared_);
  LoadUploads(archive, uploads_);
  spdlog::info("resumed {} client sessions ({} adapter uploads) from {}", sessions_.size(), uploads_.size(), path);
}

}  // namespace amaq::server
