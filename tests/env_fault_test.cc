// Durable files under injected faults (tests/fault_env.h): the N-th write, sync or rename of a
// server checkpoint or of an AQ-SGD cache save fails. Nothing is lost: the step goes on, the old
// file stays byte for byte and loads, no temporary file is left, the next save succeeds; and what
// a save wrote survives a power cut right after it (its data was synced before the rename).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "common/base/error.h"
#include "fault_env.h"
#include "inproc/local_transport.h"
#include "quant/activation_cache.h"
#include "tiny_model.h"

namespace amaq {
namespace {

using testing::FaultEnv;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The names of the plain files in `dir`.
std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) names.insert(entry.path().filename().string());
  }
  return names;
}

class FailedSave : public ::testing::TestWithParam<FaultEnv::Op> {};

std::string OpName(FaultEnv::Op op) {
  const char* names[] = {"Write", "Sync", "Rename"};
  return names[static_cast<int>(op)];
}

INSTANTIATE_TEST_SUITE_P(EnvFaults, FailedSave,
                         ::testing::Values(FaultEnv::Op::kWrite, FaultEnv::Op::kSync, FaultEnv::Op::kRename),
                         [](const ::testing::TestParamInfo<FaultEnv::Op>& info) { return OpName(info.param); });

TEST_P(FailedSave, ServerCheckpointKeepsTheOldFileAndLosesNoStep) {
  const FaultEnv::Op op = GetParam();
  const std::string model = testing::TinyModelDir("env-fault-server");
  const std::string dir = testing::TempDir("env-fault-server-checkpoints");
  FaultEnv env;
  server::ServerOptions o = testing::TinyServerOptions(model);
  o.checkpoint_dir = dir;
  o.checkpoint_every = 1;
  o.env = &env;
  {
    server::SplitServer server(o);
    inproc::LocalTransport transport(server);
    client::SplitClient c(testing::TinyClientOptions(model, "c", "bf16", 8), testing::ParityDataset(32), transport);
    int64_t step = c.Join();
    for (; step < 3; ++step) c.TrainStep(step);
    const std::string saved = ReadBytes(dir + "/server.pt");
    env.FailNth(op, "server.pt", 1);
    EXPECT_NO_THROW(c.TrainStep(step++)) << "a failed checkpoint must not fail the step";
    EXPECT_EQ(env.injected(), 1) << "the checkpoint did not " << OpName(op) << " server.pt";
    EXPECT_EQ(server.checkpoint_failures(), 1);
    EXPECT_EQ(ReadBytes(dir + "/server.pt"), saved) << "the previous checkpoint is intact";
    EXPECT_EQ(FilesIn(dir), (std::set<std::string>{"LOCK", "server.pt"})) << "no temporary file is left";
    c.TrainStep(step++);
    EXPECT_EQ(server.checkpoint_failures(), 1) << "the next checkpoint succeeds";
    EXPECT_EQ(server.Stats().at("c").steps, step);
  }
  env.DropUnsyncedData();  // a power cut after the last checkpoint (the shutdown's)
  server::ServerOptions reopened = o;
  reopened.env = Env::Default();
  EXPECT_EQ(server::SplitServer(reopened).Stats().at("c").steps, 5) << "every applied step is in the checkpoint";
}

// An AQ-SGD cache of two entries of distinct tags; `more` adds a third.
void Fill(quant::ActivationCache& cache, bool more) {
  cache.Insert(1, {1.5f, -2, 3, 4}, 2, 11);
  cache.Insert(2, {5, 6, 7, 8}, 2, 22);  // spills 1
  if (more) cache.Insert(3, {9, 10, 11, 12.25f}, 4, 33);
}

TEST_P(FailedSave, AqsgdCacheSaveKeepsTheOldFile) {
  const FaultEnv::Op op = GetParam();
  const std::string dir = testing::TempDir("env-fault-aqsgd");
  const std::string file = dir + "/client.aqsgd";
  FaultEnv env;
  quant::ActivationCache cache(16, dir + "/spill", &env);  // 16 bytes: one entry in memory, the rest spilled
  Fill(cache, false);
  cache.Save(file);
  const std::string saved = ReadBytes(file);
  Fill(cache, true);
  env.FailNth(op, "client.aqsgd", op == FaultEnv::Op::kWrite ? 5 : 1);  // a write amid the entries
  try {
    cache.Save(file);
    FAIL() << "the injected failure must reach the caller";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("previous file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(env.injected(), 1) << "the save did not " << OpName(op) << " its file";
  EXPECT_EQ(FilesIn(dir), std::set<std::string>{"client.aqsgd"}) << "no temporary file is left";
  EXPECT_EQ(ReadBytes(file), saved) << "the previous save is intact";
  quant::ActivationCache loaded(1 << 20, "");
  loaded.Load(file);
  EXPECT_EQ(loaded.stats().entries, 2u);
  cache.Save(file);
  env.DropUnsyncedData();  // a power cut right after the save
  quant::ActivationCache after_cut(1 << 20, "");
  after_cut.Load(file);
  EXPECT_EQ(after_cut.stats().entries, 3u) << "what the save wrote was synced before it replaced the old file";
  ASSERT_NE(after_cut.Find(3), nullptr);
  EXPECT_EQ(after_cut.Find(3)->back(), 12.25f);
}

}  // namespace
}  // namespace amaq
