// Clients placed on the replicas of a run (server/placement.h) and a client following the
// replica that owns it (JoinReply.owner_address, client/grpc_transport.h), against fake servers
// that answer Join only.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "amaq/v1/split_training.grpc.pb.h"
#include "client/grpc_transport.h"
#include "common/base/error.h"
#include "server/placement.h"

namespace amaq {
namespace {

std::vector<std::string> Ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("client-" + std::to_string(i));
  return ids;
}

TEST(Placement, EveryReplicaOwnsAShareAndAChangeOfTheSetMovesOnlyItsOwnClients) {
  const std::vector<std::string> ids = Ids(3000);
  std::map<std::string, int> three;
  std::map<int, int> owned;
  for (const auto& id : ids) {
    three[id] = server::OwnerOf(id, {0, 1, 2});
    ++owned[three[id]];
    EXPECT_EQ(server::OwnerOf(id, {2, 0, 1}), three[id]) << "the order of the ranks does not matter";
  }
  for (int r = 0; r < 3; ++r) EXPECT_GT(owned[r], 800) << "rank " << r << " owns " << owned[r] << " of 3000";
  int moved_in = 0;
  for (const auto& id : ids) {
    const int without_one = server::OwnerOf(id, {0, 2});
    if (three[id] != 1) EXPECT_EQ(without_one, three[id]) << id << " moved although its replica stayed";
    const int with_four = server::OwnerOf(id, {0, 1, 2, 3});
    if (with_four != 3) EXPECT_EQ(with_four, three[id]) << id << " moved, but not to the replica that joined";
    moved_in += with_four == 3;
  }
  EXPECT_GT(moved_in, 500) << "the replica that joined takes about a quarter";
  EXPECT_EQ(server::OwnerOf("anyone", {5}), 5);
}

// A server that answers Join only: with `owner` when it is set, else as the owner itself.
class FakeReplica final : public v1::SplitTraining::Service {
 public:
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request, v1::JoinReply* reply) override {
    joined.insert(request->client_id());
    if (!owner.empty()) {
      reply->set_owner_address(owner);
    } else {
      reply->set_last_applied_step(41);
      reply->set_max_chunk_bytes(1 << 20);
    }
    return grpc::Status::OK;
  }
  std::string owner;
  std::set<std::string> joined;
};

struct Running {
  explicit Running(FakeReplica& service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Running() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

client::GrpcTransport TransportTo(const std::string& server) {
  client::GrpcOptions o;
  o.server = server;
  o.insecure = true;
  return client::GrpcTransport(o);
}

JoinInfo JoinOf(const std::string& id) {
  JoinInfo info;
  info.client_id = id;
  return info;
}

TEST(Placement, AClientJoinsTheReplicaItIsSentToAndStaysWithIt) {
  FakeReplica first, owner;
  Running a(first), b(owner);
  first.owner = b.address();
  client::GrpcTransport transport = TransportTo(a.address());
  EXPECT_EQ(transport.server(), a.address());
  EXPECT_EQ(transport.Join(JoinOf("c")), 41);
  EXPECT_EQ(transport.server(), b.address()) << "what the client's CSV names as the server of its steps";
  EXPECT_EQ(first.joined, std::set<std::string>{"c"});
  EXPECT_EQ(owner.joined, std::set<std::string>{"c"});
  first.joined.clear();
  EXPECT_EQ(transport.Join(JoinOf("c")), 41) << "a rejoin goes straight to the owner";
  EXPECT_TRUE(first.joined.empty());
  EXPECT_GT(transport.bytes_up(), 0u);
}

TEST(Placement, AClientSentRoundInALoopStopsWithAClearError) {
  FakeReplica first, second;
  Running a(first), b(second);
  first.owner = b.address();
  second.owner = a.address();
  client::GrpcTransport transport = TransportTo(a.address());
  try {
    transport.Join(JoinOf("c"));
    FAIL() << "a Join sent round in a loop succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    const std::string loop = a.address() + " -> " + b.address() + " -> " + a.address();
    EXPECT_NE(std::string(e.what()).find("round in a loop (" + loop + ")"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace amaq
