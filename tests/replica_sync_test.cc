// ReplicaSync (server/replica_sync.h): two SplitServers with a shared LoRA, each a replica in a
// thread of this process, their clients trained in process on different data; the shared LoRA
// averaged over a Gloo group.
#include "server/replica_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <thread>

#include "common/model/compute_dtype.h"
#include "inproc/local_transport.h"
#include "replica_test_util.h"
#include "tiny_model.h"

namespace amaq::server {
namespace {

ServerOptions SharedServer(const std::string& dir) {
  ServerOptions o = testing::TinyServerOptions(dir);
  o.shared_lora = true;
  return o;
}

// `steps` steps of client `id` on `server`, over the parity data in the given order.
void Train(SplitServer& server, const std::string& dir, const std::string& id, bool reversed, int64_t steps) {
  Dataset data = testing::ParityDataset(64);
  if (reversed) std::reverse(data.train.begin(), data.train.end());
  client::ClientOptions o = testing::TinyClientOptions(dir, id, "fp32", steps);
  o.micro_batches = 1;  // a shared LoRA takes whole steps
  inproc::LocalTransport transport(server);
  client::SplitClient client(o, data, transport);
  client.Run();
}

std::vector<torch::Tensor> Lora(SplitServer& server, const std::string& client_id) {
  std::vector<torch::Tensor> values;
  for (const auto& [name, t] : server.AdapterOf(client_id).tensors) values.push_back(torch::tensor(t.values));
  return values;
}

struct TwoReplicas {
  explicit TwoReplicas(const std::string& name)
      : dir(testing::TinyModelDir(name)), options(SharedServer(dir)), servers{std::make_unique<SplitServer>(options),
                                                                              std::make_unique<SplitServer>(options)},
        set(2) {
    auto rank0 = JoinAs(0), rank1 = JoinAs(1);
    groups[0] = rank0.get();
    groups[1] = rank1.get();
  }
  // Client "a" trains on replica 0 and client "b" on replica 1, each `steps` steps, on the parity
  // data in opposite orders; returns each one's shared LoRA after.
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> TrainBoth(int64_t steps) {
    Train(*servers[0], dir, "a", false, steps);
    Train(*servers[1], dir, "b", true, steps);
    return {Lora(*servers[0], "a"), Lora(*servers[1], "b")};
  }
  std::future<std::unique_ptr<ReplicaGroup>> JoinAs(int rank) {
    return std::async(std::launch::async,
                      [this, rank] { return ReplicaGroup::Join(set.options[rank], IdentityOf(*servers[rank], options)); });
  }
  std::string dir;
  ServerOptions options;
  std::unique_ptr<SplitServer> servers[2];
  testing::LoopbackReplicas set;
  std::unique_ptr<ReplicaGroup> groups[2];
};

TEST(ReplicaSync, QuietReplicasEndASynchronisationHoldingTheMeanBitForBit) {
  TwoReplicas r("replica-sync");
  ReplicaSync sync0(*r.servers[0], *r.groups[0], 3600), sync1(*r.servers[1], *r.groups[1], 3600);
  const auto [before0, before1] = r.TrainBoth(3);
  bool differ = false;
  for (size_t i = 0; i < before0.size(); ++i) differ = differ || !torch::equal(before0[i], before1[i]);
  ASSERT_TRUE(differ) << "the replicas' clients trained on different data";

  auto other = std::async(std::launch::async, [&] { return sync1.SynchronizeNow(); });
  EXPECT_TRUE(sync0.SynchronizeNow());
  EXPECT_TRUE(other.get());
  const auto after0 = Lora(*r.servers[0], "a"), after1 = Lora(*r.servers[1], "b");
  ASSERT_EQ(after0.size(), before0.size());
  for (size_t i = 0; i < after0.size(); ++i) {
    EXPECT_TRUE(torch::equal(after0[i], after1[i])) << "tensor " << i;
    EXPECT_TRUE(torch::allclose(after0[i], (before0[i] + before1[i]) / 2, 1e-6, 1e-7)) << "tensor " << i;
  }
  EXPECT_EQ(sync0.synchronisations(), 1);
  EXPECT_EQ(sync0.failures(), 0);
}

// A step applied while the average is under way is kept: that replica ends at the mean plus its
// step's change, the other at the mean.
TEST(ReplicaSync, AStepAppliedDuringAnAverageIsKept) {
  TwoReplicas r("replica-sync-during");
  ReplicaSync sync0(*r.servers[0], *r.groups[0], 3600), sync1(*r.servers[1], *r.groups[1], 3600);
  const auto [before0, before1] = r.TrainBoth(2);
  // Replica 0 copies its LoRA and waits in the collective for replica 1, which first lets a step
  // of client "a" through on replica 0 (the step lock is free while the average waits).
  auto averaging = std::async(std::launch::async, [&] { return sync0.SynchronizeNow(); });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Train(*r.servers[0], r.dir, "a", false, 3);
  const auto stepped = Lora(*r.servers[0], "a");
  EXPECT_TRUE(sync1.SynchronizeNow());
  EXPECT_TRUE(averaging.get());
  const auto after0 = Lora(*r.servers[0], "a"), after1 = Lora(*r.servers[1], "b");
  bool changed = false;
  for (size_t i = 0; i < after0.size(); ++i) {
    const torch::Tensor mean = (before0[i] + before1[i]) / 2, step = stepped[i] - before0[i];
    changed = changed || step.abs().max().item<float>() > 0;
    EXPECT_TRUE(torch::allclose(after1[i], mean, 1e-6, 1e-7)) << "tensor " << i;
    EXPECT_TRUE(torch::allclose(after0[i], mean + step, 1e-5, 1e-6)) << "tensor " << i;
  }
  EXPECT_TRUE(changed) << "the step changed the LoRA";
}

TEST(ReplicaSync, TheScheduleGoesOnAfterAReplicaIsReplaced) {
  TwoReplicas r("replica-sync-replaced");
  r.TrainBoth(2);
  auto sync0 = std::make_unique<ReplicaSync>(*r.servers[0], *r.groups[0], 0.05);
  auto sync1 = std::make_unique<ReplicaSync>(*r.servers[1], *r.groups[1], 0.05);
  auto until = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done();
  };
  ASSERT_TRUE(until([&] { return sync0->synchronisations() >= 2 && sync1->synchronisations() >= 2; }));

  // Replica 1 goes away; replica 0's next synchronisations fail until its replacement joins.
  sync1.reset();
  r.groups[1].reset();
  ASSERT_TRUE(until([&] { return sync0->failures() >= 1; }));
  auto replacement = r.JoinAs(1);
  r.groups[1] = replacement.get();
  EXPECT_EQ(r.groups[1]->generation(), r.groups[0]->NewestGeneration());
  sync1 = std::make_unique<ReplicaSync>(*r.servers[1], *r.groups[1], 0.05);
  const int64_t synchronised = sync0->synchronisations();
  EXPECT_TRUE(until([&] { return sync0->synchronisations() >= synchronised + 2 && sync1->synchronisations() >= 2; }));
  EXPECT_EQ(r.groups[0]->generation(), r.groups[1]->generation());
  sync0.reset();
  sync1.reset();
  const auto lora0 = Lora(*r.servers[0], "a"), lora1 = Lora(*r.servers[1], "b");
  for (size_t i = 0; i < lora0.size(); ++i) EXPECT_TRUE(torch::equal(lora0[i], lora1[i])) << "tensor " << i;
}

TEST(ReplicaSync, TheIdentityNamesWhatMakesReplicasOneRun) {
  const std::string dir = testing::TinyModelDir("replica-identity");
  ServerOptions options = SharedServer(dir);
  SplitServer server(options);
  const ReplicaIdentity identity = IdentityOf(server, options);
  ServerOptions other = options;
  other.lr = 0.5;
  other.lora.rank = 4;
  other.compute_dtype = "bf16";
  SplitServer bf16(other);
  EXPECT_EQ(IdentityDifferences(IdentityOf(bf16, other), identity),
            "compute_dtype: bf16 here, fp32 at rank 0; lora_rank: 4 here, 8 at rank 0; lr: 0.5 here, 0.01 at rank 0");
  // auto is named as this host resolved it: a replica on a CPU with bf16 arithmetic and one without differ.
  other = options;
  other.compute_dtype = "auto";
  SplitServer automatic(other);
  EXPECT_EQ(IdentityDifferences(IdentityOf(automatic, other), identity),
            ComputesBf16Natively(torch::kCPU) ? "compute_dtype: bf16 here, fp32 at rank 0" : "");
  other = options;
  other.cut_layer = 1;
  SplitServer cut_elsewhere(other);
  const std::string differences = IdentityDifferences(IdentityOf(cut_elsewhere, other), identity);
  EXPECT_NE(differences.find("model_and_cut: "), std::string::npos) << differences;
  EXPECT_NE(differences.find("cut_layer: 1 here, 2 at rank 0"), std::string::npos) << differences;
}

}  // namespace
}  // namespace amaq::server
