#include "server/replica_group.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <map>
#include <thread>

#include "common/base/error.h"
#include "common/net/host_port.h"
#include "server/placement.h"

namespace amaq::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);  // how often a waiting replica looks at the store
const char kGenerationKey[] = "generation";
const char kIdentityKey[] = "identity";  // rank 0's ReplicaIdentity

std::string Text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> Bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// One field per line, "name\tvalue" (values hold no newline: they are settings and hashes).
std::string Serialize(const ReplicaIdentity& identity) {
  std::string text;
  for (const auto& [name, value] : identity) text += name + "\t" + value + "\n";
  return text;
}

ReplicaIdentity Deserialize(const std::string& text) {
  ReplicaIdentity identity;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin), tab = text.find('\t', begin);
    Require(end != std::string::npos && tab < end, ErrorCode::kDataLoss,
            "rank 0's identity in the rendezvous store is malformed: restart rank 0 (it writes the store afresh)");
    identity.emplace_back(text.substr(begin, tab - begin), text.substr(tab + 1, end - tab - 1));
    begin = end + 1;
  }
  return identity;
}

// The store key of `what` for `rank` in generation `g`: "g/<g>/<what>/<rank>".
std::string Key(int64_t g, const std::string& what, int rank) {
  return "g/" + std::to_string(g) + "/" + what + "/" + std::to_string(rank);
}

std::string RefusalKey(int rank) { return "refused/" + std::to_string(rank); }

}  // namespace

std::string IdentityDifferences(const ReplicaIdentity& mine, const ReplicaIdentity& theirs) {
  const std::map<std::string, std::string> other(theirs.begin(), theirs.end()), own(mine.begin(), mine.end());
  std::string out;
  auto add = [&out](const std::string& line) { out += (out.empty() ? "" : "; ") + line; };
  for (const auto& [name, value] : mine) {
    const auto it = other.find(name);
    if (it == other.end()) add(name + ": " + value + " here, absent at rank 0");
    else if (it->second != value) add(name + ": " + value + " here, " + it->second + " at rank 0");
  }
  for (const auto& [name, value] : theirs)
    if (!own.count(name)) add(name + ": absent here, " + value + " at rank 0");
  return out;
}

struct ReplicaGroup::Store {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;  // null until formed, and while re-forming
};

ReplicaGroup::ReplicaGroup(ReplicaOptions options, ReplicaIdentity identity)
    : options_(std::move(options)), identity_(std::move(identity)), store_(std::make_unique<Store>()) {}

ReplicaGroup::~ReplicaGroup() = default;

std::unique_ptr<ReplicaGroup> ReplicaGroup::Join(const ReplicaOptions& options, const ReplicaIdentity& identity) {
  Require(options.replicas >= 1, ErrorCode::kInvalidArgument,
          "replicas must be at least 1, got " + std::to_string(options.replicas));
  Require(options.rank >= 0 && options.rank < options.replicas, ErrorCode::kInvalidArgument,
          "replica_rank must be in 0.." + std::to_string(options.replicas - 1) + ", got " +
              std::to_string(options.rank) + ": number the replicas from 0");
  Require(options.timeout_seconds > 0, ErrorCode::kInvalidArgument, "the replicas' timeout must be positive");
  SplitHostPort(options.rendezvous, "rendezvous");
  SplitHostPort(options.public_address, "public_address");
  ReplicaIdentity checked = identity;  // and the size of the set each replica was started with
  checked.emplace_back("replicas", std::to_string(options.replicas));
  std::unique_ptr<ReplicaGroup> group(new ReplicaGroup(options, std::move(checked)));
  group->Connect();
  group->CheckIdentity();
  group->store_->tcp->add(kGenerationKey, 1);
  group->Form();
  return group;
}

void ReplicaGroup::Connect() {
  const auto [host, port] = SplitHostPort(options_.rendezvous, "rendezvous");
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = options_.rank == 0;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_seconds * 1000));
  try {
    store_->tcp = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable,
                "replica " + std::to_string(options_.rank) + " could not " + (o.isServer ? "start" : "reach") +
                    " the rendezvous store at " + options_.rendezvous + " (" + Excerpt(e.what(), 200) +
                    "): " + (o.isServer ? "free that port or choose another" : "start rank 0 first, or check rendezvous"));
  }
}

void ReplicaGroup::CheckIdentity() {
  auto& tcp = *store_->tcp;
  if (options_.rank == 0) {
    tcp.set(kIdentityKey, Bytes(Serialize(identity_)));
    return;
  }
  try {
    tcp.wait({kIdentityKey});
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, "replica " + std::to_string(options_.rank) + " found no identity of rank 0 in " +
                                             options_.rendezvous + " (" + Excerpt(e.what(), 200) + "): start rank 0");
  }
  const std::string differences = IdentityDifferences(identity_, Deserialize(Text(tcp.get(kIdentityKey))));
  if (!differences.empty()) {
    const std::string message = "replica " + std::to_string(options_.rank) + " is refused from the replica set at " +
                                options_.rendezvous + ": " + differences +
                                ": start every replica of a run with the same replicas, model, cut_layer, base_weights, "
                                "compute_dtype, LoRA, seed, lr, max_grad_norm and shared_lora";
    tcp.set(RefusalKey(options_.rank), Bytes(message));
    throw Error(ErrorCode::kFailedPrecondition, message);
  }
  tcp.deleteKey(RefusalKey(options_.rank));
}

void ReplicaGroup::Form() {
  auto& tcp = *store_->tcp;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_seconds * 1000));
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const int64_t g = tcp.add(kGenerationKey, 0);
    tcp.set(Key(g, "address", options_.rank), Bytes(options_.public_address));
    std::vector<std::string> keys;
    for (int r = 0; r < options_.replicas; ++r) keys.push_back(Key(g, "address", r));
    bool newer = false;
    while (!tcp.check(keys) && !(newer = tcp.add(kGenerationKey, 0) != g)) {
      Require(!cancelled_, ErrorCode::kUnavailable,
              "replica " + std::to_string(options_.rank) + " is stopping: it no longer waits for the replica set");
      if (Clock::now() > deadline) {
        std::string missing, refusals;
        for (int r = 0; r < options_.replicas; ++r) {
          if (!tcp.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          if (tcp.check({RefusalKey(r)})) refusals += " (" + Text(tcp.get(RefusalKey(r))) + ")";
        }
        throw Error(ErrorCode::kUnavailable, "the replica set did not form within " +
                                                 std::to_string(options_.timeout_seconds) + " s: rank(s) " + missing +
                                                 " did not arrive at generation " + std::to_string(g) + refusals +
                                                 ": start them with rendezvous " + options_.rendezvous);
      }
      std::this_thread::sleep_for(kPoll);
    }
    if (newer) continue;
    try {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
          SplitHostPort(options_.public_address, "public_address").first));
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("g/" + std::to_string(g) + "/gloo", store_->tcp);
      store_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options_.rank, options_.replicas, options);
    } catch (const std::exception& e) {
      if (tcp.add(kGenerationKey, 0) != g) continue;  // a replica was replaced while this one formed
      throw Error(ErrorCode::kUnavailable, "the replica set's process group did not form at generation " +
                                               std::to_string(g) + " (" + Excerpt(e.what(), 200) +
                                               "): check that every replica reaches the others' public_address");
    }
    std::vector<std::string> addresses;
    for (const auto& key : keys) addresses.push_back(Text(tcp.get(key)));
    {
      std::lock_guard<std::mutex> lock(addresses_mutex_);
      addresses_ = std::move(addresses);
    }
    generation_ = g;
    spdlog::info("replica {} of {}: the replica set formed at generation {}", options_.rank, options_.replicas, g);
    return;
  }
}

std::vector<std::string> ReplicaGroup::addresses() const {
  std::lock_guard<std::mutex> lock(addresses_mutex_);
  return addresses_;
}

std::string ReplicaGroup::OwnerAddress(const std::string& client_id) const {
  std::vector<int> ranks(static_cast<size_t>(options_.replicas));
  for (int r = 0; r < options_.replicas; ++r) ranks[r] = r;
  const int owner = OwnerOf(client_id, ranks);
  if (owner == options_.rank) return "";
  std::lock_guard<std::mutex> lock(addresses_mutex_);
  return addresses_.at(static_cast<size_t>(owner));
}

int64_t ReplicaGroup::NewestGeneration() {
  try {
    return store_->tcp->add(kGenerationKey, 0);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, "replica " + std::to_string(options_.rank) + " lost the rendezvous store at " +
                                             options_.rendezvous + " (" + Excerpt(e.what(), 200) +
                                             "): Reform when rank 0 is back");
  }
}

void ReplicaGroup::Reform() {
  store_->group.reset();
  bool store_alive = true;
  try {
    store_->tcp->add(kGenerationKey, 0);
  } catch (const std::exception&) {
    store_alive = false;  // rank 0 restarted: its new store, and its identity, again
  }
  if (!store_alive) {
    Connect();
    CheckIdentity();
  }
  store_->tcp->add(kGenerationKey, 1);  // never the generation that failed: every replica re-forming meets at the newest
  Form();
}

void ReplicaGroup::AverageInPlace(const std::vector<torch::Tensor>& tensors) {
  const int64_t newest = NewestGeneration();
  Require(store_->group && newest == generation_, ErrorCode::kFailedPrecondition,
          "replica " + std::to_string(options_.rank) + " is at generation " + std::to_string(generation_) +
              " but the replica set is at " + std::to_string(newest) + ": Reform before the next collective");
  if (tensors.empty()) return;
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) {
    Require(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu(), ErrorCode::kInternal,
            "AverageInPlace takes contiguous float32 CPU tensors: please report this");
    flat.push_back(t.view(-1));
  }
  std::vector<at::Tensor> buffer{torch::cat(flat)};
  try {
    store_->group->allreduce(buffer)->wait();
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, "replica " + std::to_string(options_.rank) +
                                             ": the average over the replica set failed (" + Excerpt(e.what(), 200) +
                                             "): a replica went away; Reform when it is back");
  }
  buffer[0].div_(options_.replicas);
  int64_t offset = 0;
  for (const auto& t : flat) {
    t.copy_(buffer[0].narrow(0, offset, t.numel()));
    offset += t.numel();
  }
}

}  // namespace amaq::server
