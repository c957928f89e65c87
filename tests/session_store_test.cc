// SessionStore on its own (no model, no steps): sessions join, go idle by the Env's clock, move to
// checkpoint_dir/sessions/ and come back with their state; the checkpoint holds every session in
// memory; a failed write (tests/fault_env.h) leaves every session in memory and the old files valid.
#include "server/session_store.h"

#include <gtest/gtest.h>

#include <deque>
#include <filesystem>

#include "common/base/error.h"
#include "fault_env.h"
#include "model_test_util.h"

namespace amaq::server {
namespace {

using testing::FaultEnv;

class SessionStoreTest : public ::testing::Test {
 protected:
  SessionStoreTest() {
    config_ = testing::TinyConfig();
    options_.checkpoint_dir = testing::TempDir("session-store");
    options_.session_ttl_seconds = 60;
    options_.env = &env_;
    lora_ = {torch::zeros({2, 3}), torch::ones({3})};
  }

  std::unique_ptr<SessionStore> Open() { return std::make_unique<SessionStore>(options_, config_, lora_); }
  // A store on a copy of checkpoint_dir as it is now: what a restarted server would load, read
  // while the store that holds checkpoint_dir (and its LOCK) lives on.
  std::unique_ptr<SessionStore> OpenCopy() {
    ServerOptions copy = options_;
    copy.checkpoint_dir = testing::TempDir("session-store-copy");
    std::filesystem::remove_all(copy.checkpoint_dir);
    std::filesystem::copy(options_.checkpoint_dir, copy.checkpoint_dir, std::filesystem::copy_options::recursive);
    copies_.push_back(copy);
    return std::make_unique<SessionStore>(copies_.back(), config_, lora_);
  }

  // Joins `id` with bf16 and gives its session recognisable state: `steps` applied, its LoRA
  // filled with `steps`.
  static void JoinWithState(SessionStore& store, const std::string& id, int64_t steps) {
    store.Join(id, *quant::Method::Parse("bf16"), "run of " + id, RunStart::kContinue);
    Session& s = store.Joined(id);
    s.last_applied = steps - 1;
    s.stats.steps = steps;
    torch::NoGradGuard no_grad;
    for (torch::Tensor& v : store.LoraOf(s).values) v.fill_(static_cast<double>(steps));
  }

  static void ExpectState(SessionStore& store, const std::string& id, int64_t steps) {
    EXPECT_EQ(store.Join(id, *quant::Method::Parse("bf16"), "run of " + id, RunStart::kContinue), steps - 1);
    Session& s = store.Joined(id);
    EXPECT_EQ(s.stats.steps, steps);
    for (const torch::Tensor& v : store.LoraOf(s).values) EXPECT_TRUE(torch::all(v == steps).item<bool>()) << id;
  }

  // a (3 steps) evicted to its own file, b (5 steps) in memory.
  void JoinTwoAndEvictTheFirst(SessionStore& store) {
    JoinWithState(store, "a", 3);
    JoinWithState(store, "b", 5);
    env_.Advance(61);
    store.Joined("b");
    ASSERT_EQ(store.EvictIdle({}), 1);
  }

  std::string SessionsDir() const { return options_.checkpoint_dir + "/sessions"; }
  size_t FilesIn(const std::string& dir) const {
    size_t n = 0;
    if (!std::filesystem::exists(dir)) return 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) n += entry.is_regular_file();
    return n;
  }

  FaultEnv env_;
  ModelConfig config_;
  ServerOptions options_;
  std::deque<ServerOptions> copies_;  // OpenCopy's, which its stores refer to
  std::vector<torch::Tensor> lora_;
};

TEST_F(SessionStoreTest, IdleSessionsMoveToDiskByTheEnvsClockAndComeBackWithTheirState) {
  auto store = Open();
  JoinWithState(*store, "a", 3);
  JoinWithState(*store, "b", 5);
  JoinWithState(*store, "c", 7);
  env_.Advance(59);
  EXPECT_EQ(store->EvictIdle({}), 0) << "59 s idle is not 60";
  store->Joined("b");  // b is seen again
  env_.Advance(2);
  EXPECT_EQ(store->EvictIdle({"c"}), 1) << "a is idle; b was seen 2 s ago; c's client is connected";
  EXPECT_EQ(store->in_memory(), 2u);
  EXPECT_EQ(store->evicted(), 1);
  EXPECT_EQ(FilesIn(SessionsDir()), 1u);
  EXPECT_THROW(store->Joined("a"), Error) << "an evicted session must be joined again";
  EXPECT_EQ(store->Stats().count("a"), 0u);
  ExpectState(*store, "a", 3);
  EXPECT_EQ(store->in_memory(), 3u);
}

TEST_F(SessionStoreTest, TheCheckpointHoldsEverySessionAndANewStoreLoadsIt) {
  JoinTwoAndEvictTheFirst(*Open());  // a in its own file, b in the checkpoint
  auto reopened = Open();
  EXPECT_EQ(reopened->in_memory(), 1u);
  EXPECT_EQ(reopened->Stats().at("b").steps, 5);
  ExpectState(*reopened, "b", 5);
  ExpectState(*reopened, "a", 3);
  reopened->Checkpoint();
  EXPECT_EQ(FilesIn(SessionsDir()), 0u) << "the checkpoint holds a now: its evicted copy is gone";
  EXPECT_EQ(OpenCopy()->Stats().at("a").steps, 3);
  EXPECT_THROW(Open(), Error) << "one store per checkpoint_dir: reopened holds its LOCK";
  reopened.reset();
  EXPECT_EQ(Open()->Stats().at("a").steps, 3) << "the LOCK goes with its store";
}

TEST_F(SessionStoreTest, AFailedEvictionKeepsTheSessionInMemoryAndTheCheckpointValid) {
  for (const FaultEnv::Op op : {FaultEnv::Op::kWrite, FaultEnv::Op::kSync, FaultEnv::Op::kRename}) {
    SCOPED_TRACE(static_cast<int>(op));
    std::filesystem::remove_all(options_.checkpoint_dir);
    auto store = Open();
    JoinWithState(*store, "a", 3);
    store->Checkpoint();
    env_.Advance(61);
    env_.FailNth(op, "/sessions/", 1);
    EXPECT_THROW(store->EvictIdle({}), Error);
    EXPECT_EQ(store->in_memory(), 1u) << "the session stays";
    EXPECT_EQ(store->evicted(), 0);
    EXPECT_EQ(FilesIn(SessionsDir()), 0u) << "no temporary file is left";
    ExpectState(*store, "a", 3);
    EXPECT_EQ(OpenCopy()->Stats().at("a").steps, 3) << "the checkpoint is intact";
    env_.Advance(61);
    EXPECT_EQ(store->EvictIdle({}), 1) << "the next eviction succeeds";
  }
}

TEST_F(SessionStoreTest, AFreshRunForgetsTheSessionItsFileAndItsCheckpointEntry) {
  auto store = Open();
  JoinTwoAndEvictTheFirst(*store);
  EXPECT_TRUE(store->Forget("a"));
  EXPECT_TRUE(store->Forget("b"));
  EXPECT_FALSE(store->Forget("never joined"));
  EXPECT_EQ(FilesIn(SessionsDir()), 0u);
  EXPECT_EQ(store->Join("b", *quant::Method::Parse("bf16"), "", RunStart::kContinue), -1) << "b starts afresh";
  EXPECT_EQ(OpenCopy()->Stats().count("a"), 0u) << "the checkpoint was written without a";
}

}  // namespace
}  // namespace amaq::server
