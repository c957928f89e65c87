// ReplicaGroup (server/replica_group.h): replicas in threads of one process, meeting at a c10d
// TCPStore on a free loopback port and averaging over a Gloo process group.
#include "server/replica_group.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "common/base/error.h"
#include "replica_test_util.h"

namespace amaq::server {
namespace {

const ReplicaIdentity kIdentity = {{"fingerprint", "abc123"}, {"cut_layer", "2"}, {"lr", "0.002"}};

// Replicas on loopback, each started in a thread of its own.
struct Replicas : testing::LoopbackReplicas {
  using LoopbackReplicas::LoopbackReplicas;
  std::future<std::unique_ptr<ReplicaGroup>> Start(int rank, const ReplicaIdentity& identity = kIdentity) {
    return std::async(std::launch::async, [this, rank, identity] { return ReplicaGroup::Join(options[rank], identity); });
  }
};

// Values whose sum depends on the order it is taken in (magnitudes from 1e-6 to 1e6).
torch::Tensor Spread(int64_t seed, std::vector<int64_t> shape) {
  torch::manual_seed(seed);
  return torch::randn(shape) * torch::exp(torch::rand(shape) * 28 - 14);
}

// Each group averages its own copy of Spread(rank) (two tensors, one of them 2-D); returns them.
std::vector<std::vector<torch::Tensor>> AverageAll(const std::vector<ReplicaGroup*>& groups) {
  std::vector<std::vector<torch::Tensor>> tensors;
  std::vector<std::future<void>> done;
  for (size_t r = 0; r < groups.size(); ++r) tensors.push_back({Spread(r, {1000}), Spread(100 + r, {64, 9})});
  for (size_t r = 0; r < groups.size(); ++r)
    done.push_back(std::async(std::launch::async, [&, r] { groups[r]->AverageInPlace(tensors[r]); }));
  for (auto& d : done) d.get();
  return tensors;
}

TEST(ReplicaGroup, ThreeReplicasFormOneGroupAndEndEachAverageWithTheSameBits) {
  Replicas set(3);
  std::vector<std::future<std::unique_ptr<ReplicaGroup>>> starting;
  for (int r = 0; r < 3; ++r) starting.push_back(set.Start(r));
  std::vector<std::unique_ptr<ReplicaGroup>> groups;
  for (auto& s : starting) groups.push_back(s.get());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(groups[r]->rank(), r);
    EXPECT_EQ(groups[r]->generation(), 3) << "three Joins, the group at the newest";
    EXPECT_EQ(groups[r]->addresses(), (std::vector<std::string>{"127.0.0.1:50100", "127.0.0.1:50101", "127.0.0.1:50102"}));
  }
  const auto averaged = AverageAll({groups[0].get(), groups[1].get(), groups[2].get()});
  for (int i = 0; i < 2; ++i) {
    const auto shape = averaged[0][i].sizes().vec();
    const int64_t seed = i == 0 ? 0 : 100;
    const auto mean = (Spread(seed, shape).to(torch::kFloat64) + Spread(seed + 1, shape).to(torch::kFloat64) +
                       Spread(seed + 2, shape).to(torch::kFloat64)) / 3;
    EXPECT_TRUE(torch::allclose(averaged[0][i].to(torch::kFloat64), mean, 1e-6, 1e-12));
    EXPECT_TRUE(torch::equal(averaged[0][i], averaged[1][i])) << "tensor " << i;
    EXPECT_TRUE(torch::equal(averaged[0][i], averaged[2][i])) << "tensor " << i;
  }
}

TEST(ReplicaGroup, AReplicaOfAnotherRunIsRefusedNamingWhatDiffers) {
  Replicas set(2, /*timeout_seconds=*/3);
  auto rank0 = set.Start(0);
  ReplicaIdentity other = kIdentity;
  other[1].second = "3";
  other.emplace_back("base_weights", "nf4");
  try {
    ReplicaGroup::Join(set.options[1], other);
    FAIL() << "a replica with another cut joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("cut_layer: 3 here, 2 at rank 0; base_weights: nf4 here, absent at rank 0"),
              std::string::npos) << e.what();
  }
  ReplicaOptions three = set.options[1];
  three.replicas = 3;
  try {
    ReplicaGroup::Join(three, kIdentity);
    FAIL() << "a replica started for a set of another size joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replicas: 3 here, 2 at rank 0"), std::string::npos) << e.what();
  }
  try {
    rank0.get();
    FAIL() << "rank 0 formed a group without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    const std::string message = e.what();
    EXPECT_NE(message.find("rank(s) 1 did not arrive"), std::string::npos) << message;
    EXPECT_NE(message.find("replicas: 3 here, 2 at rank 0"), std::string::npos) << "the last refusal, told at rank 0: " << message;
  }
}

TEST(ReplicaGroup, AReplacedReplicaRejoinsAndTheOthersReformWithoutRestarting) {
  Replicas set(2);
  auto first0 = set.Start(0), first1 = set.Start(1);
  auto rank0 = first0.get(), rank1 = first1.get();
  const int64_t formed = rank0->generation();
  AverageAll({rank0.get(), rank1.get()});

  rank1.reset();  // rank 1 crashes; its replacement joins
  auto replacement = set.Start(1);
  while (rank0->NewestGeneration() == formed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::vector<torch::Tensor> stale{Spread(7, {10})};
  const auto before = stale[0].clone();
  try {
    rank0->AverageInPlace(stale);
    FAIL() << "a collective of an older generation ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("Reform"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(stale[0], before)) << "a refused average left the tensor as it was";
  rank0->Reform();
  rank1 = replacement.get();
  EXPECT_EQ(rank0->generation(), formed + 2) << "the replacement's Join and rank 0's Reform each count one";
  EXPECT_EQ(rank1->generation(), formed + 2);
  const auto averaged = AverageAll({rank0.get(), rank1.get()});
  EXPECT_TRUE(torch::equal(averaged[0][0], averaged[1][0]));
  EXPECT_TRUE(torch::allclose(averaged[0][0], (Spread(0, {1000}) + Spread(1, {1000})) / 2));
}

TEST(ReplicaGroup, ARestartedRankZeroStartsAStoreTheOthersReachAgain) {
  Replicas set(2);
  auto first0 = set.Start(0), first1 = set.Start(1);
  auto rank0 = first0.get(), rank1 = first1.get();
  rank0.reset();  // rank 0 and its store go away
  auto reforming = std::async(std::launch::async, [&] { rank1->Reform(); });
  rank0 = set.Start(0).get();
  reforming.get();
  EXPECT_EQ(rank0->generation(), 2) << "the new store counts afresh: rank 0's Join, rank 1's Reform";
  EXPECT_EQ(rank1->generation(), 2);
  const auto averaged = AverageAll({rank0.get(), rank1.get()});
  EXPECT_TRUE(torch::equal(averaged[0][1], averaged[1][1]));
}

TEST(ReplicaGroup, BadOptionsAreRefusedBeforeAnythingStarts) {
  ReplicaOptions o;
  o.replicas = 2;
  o.rank = 2;
  o.rendezvous = "127.0.0.1:1";
  o.public_address = "127.0.0.1:2";
  try {
    ReplicaGroup::Join(o, kIdentity);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("replica_rank must be in 0..1, got 2"), std::string::npos) << e.what();
  }
  o.rank = 1;
  o.rendezvous = "nowhere";
  EXPECT_THROW(ReplicaGroup::Join(o, kIdentity), Error);
}

TEST(ReplicaGroup, IdentityDifferencesNamesEachFieldBothWays) {
  EXPECT_EQ(IdentityDifferences(kIdentity, kIdentity), "");
  EXPECT_EQ(IdentityDifferences({{"a", "1"}, {"b", "2"}}, {{"b", "3"}, {"c", "4"}}),
            "a: 1 here, absent at rank 0; b: 2 here, 3 at rank 0; c: absent here, 4 at rank 0");
}

}  // namespace
}  // namespace amaq::server
