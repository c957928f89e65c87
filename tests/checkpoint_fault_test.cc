// Checkpoints when the disk fails: a full disk (emulated with RLIMIT_FSIZE, so that write() fails
// with EFBIG the way it fails with ENOSPC, as root too) and a checkpoint folder that cannot be
// written. Training goes on (a client's evaluation and adapter too) or stops with a clear error; the
// previous checkpoint stays loadable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "inproc/local_transport.h"
#include "common/base/error.h"
#include "fault_env.h"
#include "tiny_model.h"

namespace amaq {
namespace {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// While alive, files of this process cannot grow beyond `bytes`: writes fail as on a full disk.
class DiskFull {
 public:
  explicit DiskFull(rlim_t bytes) {
    signal(SIGXFSZ, SIG_IGN);  // report EFBIG instead of killing the process
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit small = saved_;
    small.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &small);
  }
  ~DiskFull() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_{};
};

TEST(CheckpointFaults, ServerKeepsServingAndKeepsItsLastCheckpointWhenTheDiskIsFull) {
  const std::string model = testing::TinyModelDir("disk-full-server");
  const std::string checkpoints = testing::TempDir("disk-full-server-checkpoints");
  server::ServerOptions o = testing::TinyServerOptions(model);
  o.checkpoint_dir = checkpoints;
  o.checkpoint_every = 1;
  std::string saved;
  {
    server::SplitServer server(o);
    inproc::LocalTransport transport(server);
    client::SplitClient c(testing::TinyClientOptions(model, "c", "bf16", 3), testing::ParityDataset(32), transport);
    int64_t step = c.Join();
    for (; step < 3; ++step) c.TrainStep(step);
    saved = ReadBytes(checkpoints + "/server.pt");
    {
      DiskFull full(1024);
      for (; step < 5; ++step) EXPECT_NO_THROW(c.TrainStep(step)) << "a failed checkpoint must not fail the step";
      EXPECT_EQ(server.checkpoint_failures(), 2);
      try {
        server.Checkpoint();
        FAIL() << "the shutdown checkpoint must report the failure";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("previous file"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("lacks the last 2 applied steps"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(ReadBytes(checkpoints + "/server.pt"), saved) << "the previous checkpoint is intact";
    EXPECT_EQ(std::filesystem::directory_iterator(checkpoints)->path().filename(), "server.pt") << "no temporary left";
    EXPECT_EQ(server.Stats().at("c").steps, 5);
  }
  server::SplitServer restored(o);
  EXPECT_EQ(restored.Stats().at("c").steps, 3) << "the intact checkpoint loads";
}

// Issue 55 item 4: a client whose final checkpoint fails still evaluates and writes its adapter
// (before, it exited 1 on the checkpoint with neither, although the adapter's folder had space).
TEST(CheckpointFaults, AClientWhoseFinalCheckpointFailsStillEvaluatesAndExportsItsAdapter) {
  const std::string model = testing::TinyModelDir("disk-full-client");
  server::SplitServer server(testing::TinyServerOptions(model));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = testing::TinyClientOptions(model, "c", "bf16", 4);
  o.checkpoint_dir = testing::TempDir("disk-full-client-checkpoints");
  client::SplitClient(o, testing::ParityDataset(32), transport).Run();
  const std::string path = o.checkpoint_dir + "/c.pt";
  const std::string saved = ReadBytes(path);
  ASSERT_FALSE(saved.empty());
  testing::FaultEnv env;
  o.env = &env;
  o.steps = 8;
  o.checkpoint_every = 100;  // the final checkpoint is the first one written
  o.adapter_out = testing::TempDir("disk-full-client-adapter");
  env.FailNth(testing::FaultEnv::Op::kWrite, "c.pt", 1);
  client::SplitClient again(o, testing::ParityDataset(32), transport);
  EXPECT_NO_THROW(again.Run()) << "the evaluation and the adapter do not need the checkpoint";
  EXPECT_EQ(env.injected(), 1) << "the final checkpoint was not written through the Env";
  EXPECT_TRUE(again.records().back().metric.has_value()) << "the final evaluation ran";
  EXPECT_TRUE(std::filesystem::exists(o.adapter_out + "/adapter_model.safetensors")) << "the adapter was exported";
  EXPECT_EQ(ReadBytes(path), saved) << "the previous checkpoint is intact";
}

TEST(CheckpointFaults, UnwritableCheckpointFolderIsRefusedAtStart) {
  const std::string model = testing::TinyModelDir("unwritable");
  server::ServerOptions o = testing::TinyServerOptions(model);
  o.checkpoint_dir = "/proc/amaq-checkpoints";  // not writable, even for root
  try {
    server::SplitServer server(o);
    FAIL() << "the server must refuse a checkpoint folder it cannot write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint_dir"), std::string::npos) << e.what();
  }
  server::SplitServer server(testing::TinyServerOptions(model));
  inproc::LocalTransport transport(server);
  client::ClientOptions c = testing::TinyClientOptions(model, "c", "bf16", 2);
  c.checkpoint_dir = "/proc/amaq-checkpoints";
  client::SplitClient client(c, testing::ParityDataset(32), transport);
  EXPECT_THROW(client.Run(), Error);
  EXPECT_TRUE(client.records().empty()) << "refused before any step";
}

}  // namespace
}  // namespace amaq
