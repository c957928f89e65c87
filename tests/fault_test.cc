// Crashes of the real programs: amaq-server and amaq-client run as child processes over TLS and
// are killed with SIGKILL in the middle of training, then started again. Every step must end up
// applied exactly once on each side: the server's count of applied steps (kept in its
// checkpoints) equals the steps run, and the client's CSV marks each step applied once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "network_fixture.h"
#include "process.h"

namespace amaq {
namespace {

using testing::kToken1;
using testing::kToken2;
using testing::Process;
using testing::WaitFor;

struct CsvRow {
  int64_t step = 0;
  bool applied = false;
  double bits = 0;  // average bits of the step's activation
};

// The training rows of a client's CSV (the final evaluation row, with seconds 0, is left out), by
// step id: the CSV's step column counts steps done.
std::vector<CsvRow> TrainingRows(const std::string& path) {
  std::ifstream in(path);
  std::vector<CsvRow> rows;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(x);
    if (f.size() < 14 || std::stod(f[12]) == 0) continue;
    rows.push_back({std::stoll(f[2]) - 1, f[13] == "1", std::stod(f[10])});
  }
  return rows;
}

class Crashes : public testing::Network {
 protected:
  void SetUp() override { dir_ = testing::TempDir("crash-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())); }

  std::unique_ptr<Process> Server(int port, int checkpoint_every, const std::string& name = "server") {
    const std::string port_file = dir_ + "/port";
    std::filesystem::remove(port_file);
    auto p = std::make_unique<Process>(
        std::vector<std::string>{AMAQ_BIN_DIR "/amaq-server", "--model", *model_, "--seed", "7", "--lr", "0.01",
                                 "--listen", "127.0.0.1:" + std::to_string(port), "--port_file", port_file,
                                 "--tls_cert", *certs_ + "/server.pem", "--tls_key", *certs_ + "/server.key",
                                 "--tokens_file", *tokens_, "--checkpoint_dir", dir_ + "/" + name,
                                 "--checkpoint_every", std::to_string(checkpoint_every), "--threads", "1"},
        dir_ + "/" + name + ".log");
    port_ = testing::WaitForPortFile(port_file, 60);
    EXPECT_GT(port_, 0) << p->Log();
    return p;
  }

  // A client with amaq-client's default checkpoints (every step) and a fixed micro-batch count (auto's
  // depends on timing; runs here are compared byte for byte); `run` names its CSV, log,
  // checkpoint_dir and adapter (its client id by default).
  std::unique_ptr<Process> Client(const std::string& id, const std::string& token, int64_t steps,
                                  const std::string& method = "bf16", std::string run = "") {
    if (run.empty()) run = id;
    return std::make_unique<Process>(
        std::vector<std::string>{AMAQ_BIN_DIR "/amaq-client", "--server", "127.0.0.1:" + std::to_string(port_),
                                 "--tls_ca", *certs_ + "/ca.pem", "--tls_server_name", "localhost", "--token", token,
                                 "--client_id", id, "--model", *model_, "--seed", "7", "--lr", "0.01", "--method", method,
                                 "--task", "file", "--train_file", Jsonl(), "--validation_file", Jsonl(), "--steps", std::to_string(steps),
                                 "--batch", "8", "--micro_batches", "4", "--max_tokens", "16", "--eval_examples", "8", "--csv", Csv(run),
                                 "--checkpoint_dir", dir_ + "/" + run, "--adapter_out", Adapter(run), "--retry_seconds", "60",
                                 "--call_timeout_seconds", "10", "--threads", "1", "--progress=false"},
        dir_ + "/" + run + ".log");
  }

  std::string Csv(const std::string& run) const { return dir_ + "/" + run + ".csv"; }
  std::string Adapter(const std::string& run) const { return dir_ + "/adapter-" + run; }

  // The bytes of each file of an exported adapter, by name.
  static std::map<std::string, std::string> AdapterFiles(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(f.path(), std::ios::binary);
      files[f.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return files;
  }

  // The parity task as a user's JSONL file.
  std::string Jsonl() const {
    const std::string path = dir_ + "/train.jsonl";
    if (!std::filesystem::exists(path)) {
      std::ofstream out(path);
      for (const auto& e : testing::ParityDataset(64).train) {
        out << "{\"text\": \"" << e.prompt << "\", \"label\": \"" << e.completion << "\"}\n";
      }
    }
    return path;
  }

  // The server's count of applied training steps per client (its Status call).
  std::map<std::string, int64_t> AppliedSteps() {
    auto stub = RawStub();
    grpc::ClientContext context;
    Authorize(&context, testing::kAdminToken);  // an operator's token sees every client
    amaq::v1::StatusRequest request;
    amaq::v1::StatusReply reply;
    const grpc::Status status = stub->Status(&context, request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::map<std::string, int64_t> steps;
    for (const auto& c : reply.clients()) steps[c.client_id()] = c.steps();
    return steps;
  }

  // Each step 0..steps-1 has exactly one CSV row that applied it on the client.
  static void ExpectEachStepAppliedOnce(const std::vector<CsvRow>& rows, int64_t steps) {
    std::map<int64_t, int> applied;
    for (const auto& r : rows) applied[r.step] += r.applied ? 1 : 0;
    for (int64_t s = 0; s < steps; ++s) EXPECT_EQ(applied[s], 1) << "step " << s;
  }

  std::string dir_;
};

// One server per checkpoint_dir (issue 55 item 3): a second server on the same directory exits 2
// naming the first one's pid, and the first goes on serving.
TEST_F(Crashes, ASecondServerOnTheSameCheckpointDirIsRefused) {
  auto first = Server(0, 1);
  Process second({AMAQ_BIN_DIR "/amaq-server", "--model", *model_, "--listen", "127.0.0.1:0", "--tls_cert",
                  *certs_ + "/server.pem", "--tls_key", *certs_ + "/server.key", "--tokens_file", *tokens_,
                  "--checkpoint_dir", dir_ + "/server", "--threads", "1"},
                 dir_ + "/second.log");
  EXPECT_EQ(second.Wait(), 2);
  EXPECT_NE(second.Log().find("is in use ('" + dir_ + "/server/LOCK' is locked by amaq-server pid " +
                              std::to_string(first->pid()) + ")"),
            std::string::npos)
      << second.Log();
  EXPECT_TRUE(RawJoin(*RawStub(), kToken1, "client-1", "bf16").ok()) << "the first server still serves";
}

// Issue 55 item 1: whatever stops the client, its two halves stay on one history. A reference run,
// then on a second server the same run stopped by SIGINT (it checkpoints, says so, exits 130) and
// by SIGKILL (its checkpoint of every step is at most the step whose answer the server keeps
// behind), each time run again: the whole adapter (the client's LoRA and its server LoRA) equals
// the reference's byte for byte. Before, a client checkpointing every 50 steps went back to step 0
// while the server kept its 20 steps: two histories of one model.
TEST_F(Crashes, AStoppedClientEndsWithTheAdapterOfAnUninterruptedRun) {
  auto reference_server = Server(0, 1, "reference-server");
  auto reference = Client("client-1", kToken1, 30, "fp32", "reference");
  ASSERT_EQ(reference->Wait(), 0) << reference->Log();
  reference_server.reset();

  auto server = Server(0, 1);
  auto client = Client("client-1", kToken1, 30, "fp32");
  ASSERT_TRUE(WaitFor([&] { return TrainingRows(Csv("client-1")).size() >= 8; }, 120)) << client->Log();
  client->Kill(SIGINT);
  EXPECT_EQ(client->Wait(), 130) << client->Log();
  const std::vector<CsvRow> rows = TrainingRows(Csv("client-1"));
  const std::string said = "interrupted at step " + std::to_string(rows.back().step + 1) + ": run the same command to continue";
  EXPECT_NE(client->Log().find(said), std::string::npos) << client->Log();

  client = Client("client-1", kToken1, 30, "fp32");
  ASSERT_TRUE(WaitFor([&] { return TrainingRows(Csv("client-1")).size() >= rows.size() + 8; }, 120)) << client->Log();
  client->Kill(SIGKILL);
  client->Wait();
  client = Client("client-1", kToken1, 30, "fp32");
  ASSERT_EQ(client->Wait(), 0) << client->Log();

  EXPECT_EQ(AppliedSteps().at("client-1"), 30);
  const auto expected = AdapterFiles(Adapter("reference"));
  const auto got = AdapterFiles(Adapter("client-1"));
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [name, bytes] : expected) EXPECT_TRUE(got.at(name) == bytes) << name << " differs from the reference's";
}

// A restarted client whose checkpoint is further behind the server than the answers it keeps is
// refused before it sends a step, naming both counts and the way out.
TEST_F(Crashes, AClientFurtherBehindThanTheKeptAnswersIsRefused) {
  auto server = Server(0, 1);
  auto client = Client("client-1", kToken1, 12);
  ASSERT_EQ(client->Wait(), 0) << client->Log();
  std::filesystem::remove_all(dir_ + "/client-1");  // the client's checkpoints lost
  client = Client("client-1", kToken1, 12);
  EXPECT_EQ(client->Wait(), 1);
  EXPECT_NE(client->Log().find("the server has applied 12 steps of client client-1, this client 0: the server keeps the "
                               "answers to its last 2 steps only"),
            std::string::npos)
      << client->Log();
  EXPECT_NE(client->Log().find("run again with --fresh"), std::string::npos);
  EXPECT_EQ(AppliedSteps().at("client-1"), 12) << "the refusal applied nothing";
}

TEST_F(Crashes, ClientKilledMidRunResumesFromItsCheckpoint) {
  auto server = Server(0, 1);
  auto client = Client("client-1", kToken1, 24);
  ASSERT_TRUE(WaitFor([&] { return TrainingRows(Csv("client-1")).size() >= 10; }, 120)) << client->Log();
  client->Kill(SIGKILL);
  client->Wait();
  const std::vector<CsvRow> before = TrainingRows(Csv("client-1"));
  const int64_t reached = before.back().step;

  auto restarted = Client("client-1", kToken1, 24);
  ASSERT_EQ(restarted->Wait(), 0) << restarted->Log();
  const std::vector<CsvRow> all = TrainingRows(Csv("client-1"));
  const std::vector<CsvRow> after(all.begin() + static_cast<std::ptrdiff_t>(before.size()), all.end());
  ASSERT_FALSE(after.empty());
  const int64_t resumed = after.front().step;
  EXPECT_GE(resumed, reached) << "the restart begins at its last checkpoint (every step)";
  EXPECT_LE(resumed, reached + 1);
  EXPECT_NE(restarted->Log().find("restored its checkpoint of step " + std::to_string(resumed)), std::string::npos);
  // The client lost what it applied after its checkpoint: it applies those steps again (the
  // server answers them without applying), so each step is in the client's weights once: the
  // killed run's rows up to the checkpoint, the restarted run's rows from it.
  std::vector<CsvRow> kept;
  for (const auto& r : before) {
    if (r.step < resumed) kept.push_back(r);
  }
  kept.insert(kept.end(), after.begin(), after.end());
  ExpectEachStepAppliedOnce(kept, 24);
  EXPECT_EQ(AppliedSteps().at("client-1"), 24) << "the server applied each step once";
}

TEST_F(Crashes, ServerKilledMidRunClientsReconnectAndContinue) {
  // Checkpoints every 5 steps: the kill loses up to 4 applied steps on the server's side.
  auto server = Server(0, 5);
  const int port = port_;
  auto one = Client("client-1", kToken1, 30);
  auto two = Client("client-2", kToken2, 30);
  // Both clients past 6 steps: at least one checkpoint (every 5 applied steps of all clients) has
  // been written since the later one joined, so the restarted server knows both, whatever the
  // order in which a busy machine started them.
  ASSERT_TRUE(WaitFor([&] { return TrainingRows(Csv("client-1")).size() >= 12 && TrainingRows(Csv("client-2")).size() >= 6; },
                      120))
      << one->Log() << two->Log();
  server->Kill(SIGKILL);
  server->Wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  server = Server(port, 5);
  ASSERT_EQ(one->Wait(), 0) << one->Log();
  ASSERT_EQ(two->Wait(), 0) << two->Log();
  const auto applied = AppliedSteps();
  for (const std::string id : {"client-1", "client-2"}) {
    EXPECT_EQ(applied.at(id), 30) << id << ": the server's steps lost in the crash were applied again, once";
    ExpectEachStepAppliedOnce(TrainingRows(Csv(id)), 30);
  }
  EXPECT_NE(server->Log().find("resumed 2 client sessions"), std::string::npos) << server->Log();
}

// The same with AQ-SGD: both sides' caches come back from their files, so after the restart only
// the steps the two sides disagree on go in full (those the server lost, and the one it refused),
// not a whole epoch of first visits as when the server's cache was lost with it.
TEST_F(Crashes, AqsgdCachesComeBackAfterTheServerIsKilled) {
  auto server = Server(0, 5);
  const int port = port_;
  auto client = Client("client-1", kToken1, 30, "aqsgd:4");
  ASSERT_TRUE(WaitFor([&] { return TrainingRows(Csv("client-1")).size() >= 12; }, 120)) << client->Log();
  server->Kill(SIGKILL);
  server->Wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  server = Server(port, 5);
  ASSERT_EQ(client->Wait(), 0) << client->Log();
  EXPECT_EQ(AppliedSteps().at("client-1"), 30);
  const std::vector<CsvRow> rows = TrainingRows(Csv("client-1"));
  ExpectEachStepAppliedOnce(rows, 30);
  int full = 0;
  for (const CsvRow& r : rows) full += r.bits == 16 ? 1 : 0;
  EXPECT_GE(full, 8) << "the first epoch (64 examples in batches of 8) goes in full";
  EXPECT_LT(full, 8 + 8) << "after the restart, fewer than an epoch of steps in full\n" << client->Log();
}

}  // namespace
}  // namespace amaq
