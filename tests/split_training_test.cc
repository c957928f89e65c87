// The split-training system without a network: a SplitClient and a SplitServer in one process
// through LocalTransport. The network is tested in tests/network_test.cc.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "inproc/local_transport.h"
#include "client/run_csv.h"
#include "client/split_client.h"
#include "common/base/error.h"
#include "common/model/finetune.h"
#include "quant/checksum.h"
#include "common/base/config.h"
#include "quant/method.h"
#include "quant/method_keys.h"
#include "quant/tensor_codec.h"
#include "server/split_server.h"
#include "tiny_model.h"

namespace amaq {
namespace {

server::ServerOptions ServerFor(const std::string& dir) { return testing::TinyServerOptions(dir); }

client::ClientOptions ClientFor(const std::string& dir, const std::string& method, int64_t steps) {
  return testing::TinyClientOptions(dir, "client-0", method, steps);
}

// The training losses of an uncompressed split run of `steps` steps against a server with
// `server_options`, the client set up by ClientFor and then `adjust`.
std::vector<double> SplitLosses(const server::ServerOptions& server_options, const Dataset& data, int64_t steps,
                                const std::function<void(client::ClientOptions&)>& adjust) {
  server::SplitServer server(server_options);
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(server_options.model_dir, "fp32", steps);
  adjust(o);
  client::SplitClient client(o, data, transport);
  client.Run();
  std::vector<double> losses;
  for (const auto& r : client.records()) {
    if (static_cast<int64_t>(losses.size()) < steps) losses.push_back(r.loss);
  }
  return losses;
}

// The same over an NF4 base on both sides.
std::vector<double> Nf4SplitLosses(const std::string& dir, const Dataset& data, int64_t steps,
                                   const std::function<void(client::ClientOptions&)>& adjust) {
  server::ServerOptions server_options = ServerFor(dir);
  server_options.base_weights = "nf4";
  return SplitLosses(server_options, data, steps, [&](client::ClientOptions& o) {
    o.base_weights = "nf4";
    adjust(o);
  });
}

// The test that proves the system computes what it claims: uncompressed split training follows
// local unsplit training step for step.
TEST(SplitTraining, Fp32SplitFollowsLocalTrainingExactly) {
  const std::string dir = testing::TinyModelDir("equivalence");
  const Dataset data = testing::ParityDataset(48);
  const FinetuneResult reference = FinetuneLocal(data, testing::TinyLocalOptions(dir, 25));

  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(dir, "fp32", 25);
  o.micro_batches = 1;  // the local run's whole steps, rounding included (parts: MicroBatchesGiveTheUpdateOfTheWholeStep)
  client::SplitClient client(o, data, transport);
  client.Run();
  ASSERT_GE(client.records().size(), 25u);
  for (size_t i = 0; i < 25; ++i) {
    EXPECT_NEAR(client.records()[i].loss, reference.losses[i], 1e-4 * std::fabs(reference.losses[i]) + 1e-5) << "step " << i;
  }
  EXPECT_LT(reference.losses.back(), reference.losses.front());
}

// ||after_a - after_b|| / ||after_a - before||: how far two updates of the same LoRA differ,
// relative to the update (L2 over every tensor).
double UpdateDifference(const NamedFloats& before, const NamedFloats& after_a, const NamedFloats& after_b) {
  double diff = 0, update = 0;
  for (const auto& [name, t] : before) {
    const std::vector<float>& a = after_a.at(name).values;
    const std::vector<float>& b = after_b.at(name).values;
    EXPECT_EQ(a.size(), t.values.size()) << name;
    EXPECT_EQ(b.size(), t.values.size()) << name;
    for (size_t i = 0; i < t.values.size() && i < a.size() && i < b.size(); ++i) {
      diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      update += (static_cast<double>(a[i]) - t.values[i]) * (static_cast<double>(a[i]) - t.values[i]);
    }
  }
  return std::sqrt(diff / update);
}

// A step sent in 2 or 4 parts of its rows (a batch of 7 rows that does not split evenly, so the
// parts' shares of the labels differ) gives the loss and both LoRA updates of the step sent whole.
// The updates are compared after one step: over more steps AdamW, which divides each element by
// its own gradient's magnitude, turns gradients at rounding level (elements whose gradient
// cancels to ~1e-9, summed in another order) into updates of ~1 % of the learning rate, and the
// update of the client's LoRA differs by up to 2e-4 after 2-8 steps; the losses stay within 1e-5.
TEST(SplitTraining, MicroBatchesGiveTheUpdateOfTheWholeStep) {
  const std::string dir = testing::TinyModelDir("micro-batches");
  const Dataset data = testing::ParityDataset(48);
  struct Run {
    std::vector<float> losses;
    NamedFloats client_before, server_before, client_after_one, server_after_one;
  };
  const auto run = [&](int64_t parts) {
    server::SplitServer server(ServerFor(dir));
    inproc::LocalTransport transport(server);
    client::ClientOptions o = ClientFor(dir, "fp32", 4);
    o.batch = 7;
    o.micro_batches = parts;
    client::SplitClient client(o, data, transport);
    Run r;
    client.Join();
    r.client_before = client.Adapter();
    r.server_before = server.AdapterOf("client-0").tensors;
    for (int64_t step = 0; step < 4; ++step) {
      r.losses.push_back(client.TrainStep(step).loss);
      if (step == 0) {
        r.client_after_one = client.Adapter();
        r.server_after_one = server.AdapterOf("client-0").tensors;
      }
    }
    EXPECT_EQ(server.AdapterOf("client-0").applied_steps, 4);
    return r;
  };
  const Run whole = run(1);
  for (int64_t parts : {2, 4}) {
    SCOPED_TRACE(std::to_string(parts) + " parts");
    const Run split = run(parts);
    for (size_t i = 0; i < whole.losses.size(); ++i) {
      EXPECT_NEAR(split.losses[i], whole.losses[i], 1e-5 * std::fabs(whole.losses[i])) << "step " << i;
    }
    EXPECT_LT(UpdateDifference(whole.client_before, whole.client_after_one, split.client_after_one), 1e-5);
    EXPECT_LT(UpdateDifference(whole.server_before, whole.server_after_one, split.server_after_one), 1e-5);
  }
}

// LocalTransport as if its calls crossed a network (Transport::over_network), so that auto tries
// the counts.
class LinkedTransport : public inproc::LocalTransport {
 public:
  using LocalTransport::LocalTransport;
  bool over_network() const override { return true; }
};

// micro_batches auto: in one process every step goes whole and trains as micro_batches 1 does, bit
// for bit; over a network the client's first steps try 1, 2, 4 and 8 parts in turn (after one
// unmeasured step, kRounds times round) and every later step uses the one count chosen; each step
// is applied once.
TEST(SplitTraining, AutoMicroBatchesAreWholeStepsInOneProcessAndTriedOverANetwork) {
  const std::string dir = testing::TinyModelDir("micro-batches-auto");
  const Dataset data = testing::ParityDataset(48);
  const auto run = [&](int64_t micro_batches, bool linked) {
    server::SplitServer server(ServerFor(dir));
    LinkedTransport linked_transport(server);
    inproc::LocalTransport local_transport(server);
    client::ClientOptions o = ClientFor(dir, "fixed:8:channel", 24);
    o.micro_batches = micro_batches;
    client::SplitClient client(o, data, linked ? static_cast<client::Transport&>(linked_transport) : local_transport);
    client.Run();
    EXPECT_EQ(server.AdapterOf("client-0").applied_steps, 24);
    std::vector<client::StepRecord> steps;
    for (const client::StepRecord& r : client.records()) {
      if (steps.empty() || r.step != steps.back().step) steps.push_back(r);  // an evaluation repeats its step
    }
    return std::make_pair(steps, client.Adapter());
  };
  const auto [auto_steps, auto_adapter] = run(client::MicroBatchChoice::kAuto, false);
  const auto [whole_steps, whole_adapter] = run(1, false);
  ASSERT_EQ(auto_steps.size(), 24u);
  for (size_t i = 0; i < auto_steps.size(); ++i) {
    EXPECT_EQ(auto_steps[i].parts, 1) << "step " << i;
    EXPECT_EQ(auto_steps[i].loss, whole_steps[i].loss) << "step " << i;
  }
  for (const auto& [name, t] : whole_adapter) EXPECT_EQ(auto_adapter.at(name).values, t.values) << name;

  const auto [linked_steps, linked_adapter] = run(client::MicroBatchChoice::kAuto, true);
  ASSERT_EQ(linked_steps.size(), 24u);
  std::vector<int64_t> parts;
  for (const client::StepRecord& r : linked_steps) parts.push_back(r.parts);
  std::vector<int64_t> trials{1};
  for (int round = 0; round < client::MicroBatchChoice::kRounds; ++round) trials.insert(trials.end(), {1, 2, 4, 8});
  ASSERT_EQ(trials.size(), 21u);
  EXPECT_EQ(std::vector<int64_t>(parts.begin(), parts.begin() + 21), trials);
  for (size_t i = 21; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i], parts[21]) << "step " << i << " left the chosen count";
  }
  EXPECT_TRUE(parts[21] == 1 || parts[21] == 2 || parts[21] == 4 || parts[21] == 8) << parts[21];
}

// One step stale: Run begins step t + 1 (forward, send) before step t's answer has come back, on
// the client's LoRA predicted for after step t's update (below); at step 1 there is no update to
// predict from, so it runs on the weights from before step 0's update. With the client's learning rate 0 its weights
// never move, so a stale run must give the serial run's losses exactly (two steps in flight, each
// answered with its own gradient). With a learning rate, step 1's loss must be that of a client
// whose weights did not move at step 0 (the server's step 0 is the same), not the serial run's;
// the stale steps still train the client's weights, and the server applies every step once.
TEST(SplitTraining, AOneStepStaleStepForwardsOnTheWeightsFromBeforeTheStepAhead) {
  const std::string dir = testing::TinyModelDir("one-step-stale");
  const Dataset data = testing::ParityDataset(48);
  struct Run {
    std::vector<float> losses;
    NamedFloats client_before, client_after;
  };
  const auto run = [&](double lr, bool stale) {
    server::SplitServer server(ServerFor(dir));
    inproc::LocalTransport transport(server);
    client::ClientOptions o = ClientFor(dir, "fixed:8:channel", 6);
    o.micro_batches = 2;
    o.lr = lr;
    o.one_step_stale = stale;
    client::SplitClient client(o, data, transport);
    Run r;
    r.client_before = client.Adapter();
    client.Run();
    for (const auto& record : client.records()) {
      if (r.losses.size() < 6) r.losses.push_back(record.loss);
    }
    r.client_after = client.Adapter();
    EXPECT_EQ(server.AdapterOf("client-0").applied_steps, 6);
    return r;
  };
  const Run frozen = run(0, false), frozen_stale = run(0, true);
  EXPECT_EQ(frozen_stale.losses, frozen.losses);
  const Run serial = run(1e-2, false), stale = run(1e-2, true);
  EXPECT_EQ(stale.losses[0], serial.losses[0]);
  EXPECT_EQ(stale.losses[1], frozen.losses[1]) << "step 1 ran on the weights from before step 0's update";
  EXPECT_NE(stale.losses[1], serial.losses[1]);
  const auto same = [](const NamedFloats& a, const NamedFloats& b) {
    return std::all_of(a.begin(), a.end(),
                       [&](const auto& entry) { return entry.second.values == b.at(entry.first).values; });
  };
  EXPECT_TRUE(same(frozen_stale.client_after, frozen_stale.client_before));
  EXPECT_FALSE(same(stale.client_after, stale.client_before)) << "the stale steps' gradients reach the client's weights";
}

// What a client sent: each step's first part's activation, and the client's LoRA at that moment
// (`client`, when set); SyncAdapters answers `preset`.
struct CapturingTransport : inproc::LocalTransport {
  using inproc::LocalTransport::LocalTransport;
  void Send(const StepInput& in) override {
    if (in.kind == StepKind::kTrain && in.micro_batch == 0 && !activations.count(in.step_id)) {
      activations[in.step_id] = in.activation;
      if (client) weights[in.step_id] = client->Adapter();
    }
    inproc::LocalTransport::Send(in);
  }
  NamedFloats SyncAdapters(const NamedFloats&) override { return preset; }
  client::SplitClient* client = nullptr;
  std::map<int64_t, std::vector<uint8_t>> activations;
  std::map<int64_t, NamedFloats> weights;
  NamedFloats preset;
};

// A client one step stale with whole steps sent as fp32 (the activations on the wire are exact).
client::ClientOptions StaleFp32Client(const std::string& dir) {
  client::ClientOptions o = ClientFor(dir, "fp32", 4);
  o.micro_batches = 1;
  o.one_step_stale = true;
  return o;
}

torch::Tensor DecodedActivation(const std::vector<uint8_t>& bytes) {
  quant::Decoder decoder;
  return quant::DecodeTensor(decoder, bytes.data(), bytes.size());
}

// Step 2 of a stale run begins after step 0's update (weights W1) and before step 1's: its forward
// runs on the prediction W1 + (W1 - W0), the last update added once more. A serial client given
// exactly those weights sends the same activation for step 2 (fp32 on the wire, so it is exact).
TEST(SplitTraining, AOneStepStaleStepForwardsOnTheWeightsPlusTheLastUpdate) {
  const std::string dir = testing::TinyModelDir("one-step-stale");
  const Dataset data = testing::ParityDataset(48);
  client::ClientOptions o = StaleFp32Client(dir);
  server::SplitServer server(ServerFor(dir));
  CapturingTransport stale_transport(server);
  client::SplitClient stale(o, data, stale_transport);
  stale_transport.client = &stale;
  stale.Run();
  // Begin(1) ran before step 0's update (W0), Begin(2) after it (W1).
  const NamedFloats& w0 = stale_transport.weights.at(1);
  const NamedFloats& w1 = stale_transport.weights.at(2);
  NamedFloats predicted = w1;
  double moved = 0;
  for (auto& [name, t] : predicted) {
    for (size_t i = 0; i < t.values.size(); ++i) {
      t.values[i] = w1.at(name).values[i] + (w1.at(name).values[i] - w0.at(name).values[i]);
      moved += std::fabs(w1.at(name).values[i] - w0.at(name).values[i]);
    }
  }
  ASSERT_GT(moved, 0) << "step 0 must have moved the weights";

  server::SplitServer fresh(ServerFor(dir));
  CapturingTransport reference_transport(fresh);
  reference_transport.preset = predicted;
  o.one_step_stale = false;
  client::SplitClient reference(o, data, reference_transport);
  reference.Join();
  reference.SyncAdapters();  // its weights become the prediction
  EXPECT_THROW(reference.TrainStep(2), Error) << "a fresh server refuses step 2; its activation was sent";
  const torch::Tensor sent = DecodedActivation(stale_transport.activations.at(2));
  EXPECT_TRUE(torch::allclose(sent, DecodedActivation(reference_transport.activations.at(2)), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(sent, DecodedActivation(stale_transport.activations.at(1)), 1e-3, 1e-3)) << "another batch";
}

// The prediction survives a restart: a stale run stopped after 2 steps (its checkpoint holds step
// 1's update) and resumed sends for step 3 (begun before step 2's update, predicted from step 1's)
// the activation the uninterrupted run sent.
TEST(SplitTraining, AResumedOneStepStaleRunPredictsAsTheUninterruptedOne) {
  const std::string dir = testing::TinyModelDir("one-step-stale");
  const Dataset data = testing::ParityDataset(48);
  client::ClientOptions o = StaleFp32Client(dir);
  o.checkpoint_every = 2;
  o.checkpoint_dir = testing::TempDir("stale-uninterrupted");
  server::SplitServer uninterrupted_server(ServerFor(dir));
  CapturingTransport uninterrupted(uninterrupted_server);
  client::SplitClient(o, data, uninterrupted).Run();

  o.checkpoint_dir = testing::TempDir("stale-resumed");
  server::SplitServer server(ServerFor(dir));
  CapturingTransport resumed(server);
  o.steps = 2;
  client::SplitClient(o, data, resumed).Run();
  o.steps = 4;
  client::SplitClient(o, data, resumed).Run();
  EXPECT_EQ(server.AdapterOf("client-0").applied_steps, 4);
  EXPECT_TRUE(torch::allclose(DecodedActivation(resumed.activations.at(3)),
                              DecodedActivation(uninterrupted.activations.at(3)), 1e-6, 1e-7));
}

// Copies archive `in` into `out` key by key, nested archives included, with the tensor at
// `poisoned` ("a/b" for nested keys) filled with NaN.
void CopyPoisoned(torch::serialize::InputArchive& in, torch::serialize::OutputArchive& out, const std::string& poisoned,
                  const std::string& prefix = "") {
  for (const std::string& key : in.keys()) {
    torch::Tensor t;
    torch::serialize::InputArchive nested_in;
    c10::IValue value;
    if (in.try_read(key, t)) {
      out.write(key, prefix + key == poisoned ? torch::full_like(t, NAN) : t);
    } else if (in.try_read(key, nested_in)) {
      torch::serialize::OutputArchive nested_out;
      CopyPoisoned(nested_in, nested_out, poisoned, prefix + key + "/");
      out.write(key, nested_out);
    } else if (in.try_read(key, value)) {
      out.write(key, value);
    }
  }
}

// The key ("a/b" for nested ones) of the first floating-point tensor of `path` whose key starts with
// `prefix`; empty when there is none.
std::string FirstFloatTensorKey(torch::serialize::InputArchive& in, const std::string& prefix, const std::string& at = "") {
  for (const std::string& key : in.keys()) {
    torch::Tensor t;
    torch::serialize::InputArchive nested;
    if (in.try_read(key, t)) {
      if (t.is_floating_point() && (at + key).rfind(prefix, 0) == 0) return at + key;
    } else if (in.try_read(key, nested)) {
      const std::string found = FirstFloatTensorKey(nested, prefix, at + key + "/");
      if (!found.empty()) return found;
    }
  }
  return "";
}

std::string FirstFloatTensorKey(const std::string& path, const std::string& prefix) {
  torch::serialize::InputArchive in;
  in.load_from(path);
  return FirstFloatTensorKey(in, prefix);
}

// Rewrites checkpoint `path` with the tensor `poisoned` all NaN.
void PoisonCheckpoint(const std::string& path, const std::string& poisoned) {
  torch::serialize::InputArchive in;
  in.load_from(path);
  torch::serialize::OutputArchive out;
  CopyPoisoned(in, out, poisoned);
  out.save_to(path);
}

// Issue 40 item 4: a checkpoint holding a NaN (a LoRA tensor, or an optimizer moment inside a
// nested archive) is refused with its file and key before anything is taken from it, on either side.
TEST(SplitTraining, NonFiniteCheckpointsAreRefusedByFileAndTensor) {
  const std::string dir = testing::TinyModelDir("nan-checkpoints");
  const Dataset data = testing::ParityDataset(16);
  client::ClientOptions o = testing::TinyClientOptions(dir, "client-0", "fp32", 2);
  o.checkpoint_every = 2;
  o.checkpoint_dir = testing::TempDir("nan-client-ckpt");
  server::ServerOptions so = ServerFor(dir);
  so.checkpoint_dir = testing::TempDir("nan-server-ckpt");
  {
    server::SplitServer server(so);
    inproc::LocalTransport transport(server);
    client::SplitClient(o, data, transport).Run();
    server.Checkpoint();
  }
  const auto refused = [](const std::function<void()>& load, const std::string& file, const std::string& key) {
    try {
      load();
      return ::testing::AssertionFailure() << "loaded with " << key << " NaN";
    } catch (const Error& e) {
      const std::string m = e.what();
      if (e.code() != ErrorCode::kDataLoss || m.find(file) == std::string::npos || m.find("'" + key + "'") == std::string::npos) {
        return ::testing::AssertionFailure() << m;
      }
      return ::testing::AssertionSuccess();
    }
  };
  const std::string server_file = so.checkpoint_dir + "/server.pt";
  ASSERT_TRUE(std::filesystem::exists(server_file));
  const std::string saved = server_file + ".saved";
  std::filesystem::copy_file(server_file, saved);
  for (const std::string prefix : {"client.client-0.lora.", "client.client-0.optimizer/"}) {
    const std::string key = FirstFloatTensorKey(server_file, prefix);
    ASSERT_FALSE(key.empty()) << prefix;
    PoisonCheckpoint(server_file, key);
    EXPECT_TRUE(refused([&] { server::SplitServer s(so); }, server_file, key));
    std::filesystem::copy_file(saved, server_file, std::filesystem::copy_options::overwrite_existing);
  }
  server::SplitServer server(so);
  inproc::LocalTransport transport(server);
  const std::string client_file = o.checkpoint_dir + "/client-0.pt";
  const std::string lora_key = FirstFloatTensorKey(client_file, "lora.");
  ASSERT_FALSE(lora_key.empty());
  PoisonCheckpoint(client_file, lora_key);
  const auto size_before = std::filesystem::file_size(client_file);
  o.steps = 4;
  EXPECT_TRUE(refused([&] { client::SplitClient(o, data, transport).Run(); }, client_file, lora_key));
  EXPECT_EQ(std::filesystem::file_size(client_file), size_before) << "the refused checkpoint is left as it was";
}

TEST(SplitTraining, OneStepStaleWithRecomputedLayersIsRefused) {
  const std::string dir = testing::TinyModelDir("one-step-stale");
  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(dir, "fp32", 2);
  o.one_step_stale = true;
  o.recompute_layers = true;
  try {
    client::SplitClient client(o, testing::ParityDataset(8), transport);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("turn one of them off"), std::string::npos) << e.what();
  }
}

// NF4 bases on both sides (the client recomputing its layers) follow local training on the same
// NF4 base: each side quantizes the checkpoint alike, and recomputation changes no gradient.
TEST(SplitTraining, Nf4SplitWithRecomputationFollowsLocalNf4Training) {
  const std::string dir = testing::TinyModelDir("nf4-equivalence");
  const Dataset data = testing::ParityDataset(48);
  FinetuneOptions local = testing::TinyLocalOptions(dir, 15);
  local.base_weights = BaseWeights::kNf4;
  const FinetuneResult reference = FinetuneLocal(data, local);
  const FinetuneResult dense = FinetuneLocal(data, testing::TinyLocalOptions(dir, 15));

  const std::vector<double> losses = Nf4SplitLosses(dir, data, 15, [](client::ClientOptions& o) { o.recompute_layers = true; });
  ASSERT_EQ(losses.size(), 15u);
  for (size_t i = 0; i < 15; ++i) {
    EXPECT_NEAR(losses[i], reference.losses[i], 1e-4 * std::fabs(reference.losses[i]) + 1e-5) << "step " << i;
  }
  EXPECT_NE(reference.losses[0], dense.losses[0]);  // the 4-bit base is not the dense one
}

// The losses of 30 steps computed in bf16 against the same run in fp32: not equal (bf16 was used),
// within 5% over the first three steps, and both train. Later steps at this learning rate are
// noisy on both paths (single batches of 8), so they are compared by their means.
void ExpectBf16FollowsFp32(const std::vector<double>& fp32, const std::vector<double>& bf16) {
  ASSERT_EQ(fp32.size(), 30u);
  ASSERT_EQ(bf16.size(), 30u);
  EXPECT_NE(bf16[0], fp32[0]);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(bf16[i], fp32[i], 0.05 * fp32[i]) << "step " << i;
  const auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
           static_cast<double>(to - from);
  };
  for (const auto* l : {&fp32, &bf16}) EXPECT_LT(mean(*l, 20, 30), 0.1 * mean(*l, 0, 3));
}

// A client computing in bf16 over an nf4 base (QLoRA's recipe) sends fp32 activations and takes
// fp32 gradients at the cut; it follows the fp32 client within bf16's rounding over the first
// steps, and trains as the fp32 client does.
TEST(SplitTraining, Bf16ComputeClientFollowsTheFp32Client) {
  const std::string dir = testing::TinyModelDir("bf16-compute");
  const Dataset data = testing::ParityDataset(48);
  const std::vector<double> losses[2] = {
      Nf4SplitLosses(dir, data, 30, [](client::ClientOptions&) {}),
      Nf4SplitLosses(dir, data, 30, [](client::ClientOptions& o) { o.compute_dtype = "bf16"; })};
  ExpectBf16FollowsFp32(losses[0], losses[1]);
}

// A server computing in bf16 takes the cut's fp32 activations, runs its layers and head in bf16
// (the loss in fp32) and answers fp32 gradients: it follows the fp32 server within bf16's rounding
// over the first steps, and trains as the fp32 server does.
TEST(SplitTraining, Bf16ComputeServerFollowsTheFp32Server) {
  const std::string dir = testing::TinyModelDir("bf16-compute-server");
  const Dataset data = testing::ParityDataset(48);
  server::ServerOptions bf16_server = ServerFor(dir);
  bf16_server.compute_dtype = "bf16";
  const auto unchanged = [](client::ClientOptions&) {};
  const std::vector<double> losses[2] = {SplitLosses(ServerFor(dir), data, 30, unchanged),
                                         SplitLosses(bf16_server, data, 30, unchanged)};
  ExpectBf16FollowsFp32(losses[0], losses[1]);
}

TEST(SplitTraining, AmaqBitsFallAndTheTaskTrains) {
  const std::string dir = testing::TinyModelDir("amaq-split");
  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(dir, "amaq:8->3", 60);
  o.method_settings.Set("amaq_gate_lr", 0.2);
  o.method_settings.Set("amaq_beta", 1.0);
  client::SplitClient client(o, testing::ParityDataset(48), transport);
  client.Run();
  const auto& r = client.records();
  EXPECT_DOUBLE_EQ(r.front().average_bits, 8.0);
  EXPECT_LT(r[59].average_bits, 6.0);
  EXPECT_LT(r[59].up.payload, r.front().up.payload);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r[i].loss / 5;
    last += r[55 + i].loss / 5;
  }
  EXPECT_LT(last, first);
}

// The budget is met in the system, not only in the quantizer: the last quarter of a short run
// sends exactly the target's bits, after a descent from 8 that the records show.
TEST(SplitTraining, AmaqBudgetIsMetOverTheLastQuarter) {
  const std::string dir = testing::TinyModelDir("amaq-budget");
  for (const char* method : {"amaq:budget=3", "amaq:budget=4.5"}) {
    server::SplitServer server(ServerFor(dir));
    inproc::LocalTransport transport(server);
    client::SplitClient client(ClientFor(dir, method, 40), testing::ParityDataset(48), transport);
    client.Run();
    const auto& r = client.records();
    const double target = *quant::Method::Parse(method)->target_bits();
    EXPECT_DOUBLE_EQ(r.front().average_bits, 8.0) << method;
    EXPECT_GT(r[10].average_bits, target + 1) << method << ": the descent is visible";
    double last_quarter = 0;
    for (size_t i = 30; i < 40; ++i) last_quarter += r[i].average_bits / 10;
    EXPECT_NEAR(last_quarter, target, 0.05) << method;
  }
}

// The statistics amaq-study relates AMAQ's widths to, on values whose moments are known.
TEST(CutStatistics, AccumulatesPerChannelMomentsOverSteps) {
  client::CutStatistics stats;
  EXPECT_TRUE(stats.Channels().empty());
  // Channel 0 alternates -1, 1 (mean 0, sd 1, excess kurtosis -2); channel 1 is 0, 0, 0, 4.
  stats.Add(torch::tensor({{-1.f, 0.f}, {1.f, 0.f}}), torch::tensor({{0.5f, -2.f}, {-0.5f, 2.f}}));
  stats.Add(torch::tensor({{-1.f, 0.f}, {1.f, 4.f}}), torch::tensor({{0.5f, 0.f}, {0.5f, 0.f}}));
  const auto c = stats.Channels();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_DOUBLE_EQ(c[0].min, -1);
  EXPECT_DOUBLE_EQ(c[0].max, 1);
  EXPECT_NEAR(c[0].mean, 0, 1e-12);
  EXPECT_NEAR(c[0].stddev, 1, 1e-12);
  EXPECT_NEAR(c[0].kurtosis, -2, 1e-9);
  EXPECT_NEAR(c[0].mean_abs_gradient, 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(c[1].max, 4);
  EXPECT_NEAR(c[1].mean, 1, 1e-12);
  EXPECT_NEAR(c[1].stddev, std::sqrt(3.0), 1e-12);    // E[x^2] = 4, minus mean^2
  EXPECT_NEAR(c[1].kurtosis, 21.0 / 9.0 - 3, 1e-9);  // m4 = (1 + 1 + 1 + 81) / 4 = 21, m2^2 = 9
  EXPECT_NEAR(c[1].mean_abs_gradient, 1, 1e-12);
  EXPECT_THROW(stats.Add(torch::zeros({2, 3}), torch::zeros({2, 3})), Error);  // channel count changed
  EXPECT_THROW(stats.Add(torch::zeros({2, 2}), torch::zeros({3, 2})), Error);  // shapes differ
}

// Every method trains through the system, sends what it claims (the first step's average width),
// and both sides count the same codec bytes: what the client's records say it sent and received
// is what the server's statistics say it received and sent.
TEST(SplitTraining, EveryMethodRunsAndCountsItsBytes) {
  const std::string dir = testing::TinyModelDir("methods");
  const std::pair<const char*, double> methods[] = {
      {"bf16", 16}, {"fixed:4:channel", 4}, {"fixed:3:group:16", 3}, {"aqsgd:4", 16}, {"amaq:budget=4", 8}};
  for (const auto& [method, first_bits] : methods) {
    server::SplitServer server(ServerFor(dir));
    inproc::LocalTransport transport(server);
    client::SplitClient client(ClientFor(dir, method, 12), testing::ParityDataset(16), transport);
    quant::ByteCount up, down;
    for (int64_t step = client.Join(); step < 12; ++step) {
      const client::StepRecord r = client.TrainStep(step);
      up += r.up;
      down += r.down;
    }
    EXPECT_DOUBLE_EQ(client.records().front().average_bits, first_bits) << method;
    const server::ClientStats stats = server.Stats().at("client-0");
    EXPECT_EQ(stats.steps, 12) << method;
    EXPECT_EQ(stats.activation_bytes, up.total()) << method;
    EXPECT_EQ(stats.gradient_bytes, down.total()) << method;
    EXPECT_GT(transport.bytes_up(), up.total()) << method << ": the protocol's fields come on top";
    const double metric = client.Evaluate();
    EXPECT_TRUE(metric >= 0 && metric <= 1) << method << ": " << metric;
  }
}

// A method added by a test, with a setting of its own: its class and one registration (its name,
// parser, grammar, docs row and setting) are all it takes; the setting becomes a config key, its
// value reaches the method's codec, and the system trains with it.
TEST(SplitTraining, AMethodWithASettingAddedByATestTrainsThroughTheSystem) {
  class TestFixed : public quant::Method {
   public:
    std::string ToString() const override { return "test-fixed"; }
    std::unique_ptr<quant::ClientCodec> MakeClientCodec(const quant::CodecContext& context) const override {
      const auto bits = static_cast<uint8_t>(context.settings.Integer("test_fixed_bits"));
      return std::make_unique<quant::PlainClientCodec>(Affine(), quant::BitsTable::Uniform(bits));
    }
    std::unique_ptr<quant::ServerCodec> MakeServerCodec(const quant::CodecContext&) const override {
      struct Answer : quant::ServerCodec {
        quant::GradientFormat GradientFor(const quant::Decoded&) const override {
          quant::EncodeOptions fp16;
          fp16.scheme = quant::Scheme::kFloat16;
          return {fp16, {}};
        }
      };
      return std::make_unique<Answer>();
    }
    static quant::EncodeOptions Affine() {
      quant::EncodeOptions o;
      o.scheme = quant::Scheme::kAffine;
      o.granularity = quant::Granularity::kChannel;
      return o;
    }
  };
  quant::RegisterMethod({{"test-fixed"},
                         [](const quant::MethodName& name) -> std::unique_ptr<quant::Method> {
                           if (!name.arguments.empty() || name.gradient) name.Refuse("test-fixed takes no arguments");
                           return std::make_unique<TestFixed>();
                         },
                         "test-fixed",
                         {{"`test-fixed`", "affine per channel at test_fixed_bits bits"}},
                         {{"test_fixed_bits", quant::MethodSetting::Kind::kInteger, "width of test-fixed", 2, 8, 8}}});
  EXPECT_NE(quant::MethodGrammar().find("test-fixed"), std::string::npos);
  Config config("amaq-test");
  quant::AddClientMethodKeys(config, {});
  EXPECT_NE(config.Help().find("test_fixed_bits"), std::string::npos) << config.Help();
  config.Load("", "test.yaml", {"--test_fixed_bits", "5"});
  EXPECT_THROW(Config(config).Load("", "test.yaml", {"--test_fixed_bits", "9"}), Error) << "outside the declared range";

  const std::string dir = testing::TinyModelDir("toy-method");
  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(dir, "test-fixed", 6);
  o.method_settings = quant::ClientMethodSettingsFrom(config);
  client::SplitClient client(o, testing::ParityDataset(16), transport);
  client.Run();
  EXPECT_EQ(server.Stats().at("client-0").steps, 6);
  for (const client::StepRecord& r : client.records()) EXPECT_EQ(r.average_bits, 5) << "the setting's width, not its default";
}

// The server's rate limit slows a client down without ending its run: the client waits and sends
// the refused step again (RESOURCE_EXHAUSTED is retried with backoff).
TEST(SplitTraining, TheClientWaitsOutTheServersRateLimit) {
  const std::string dir = testing::TinyModelDir("rate-limited");
  server::ServerOptions o = ServerFor(dir);
  o.max_steps_per_second = 4;
  server::SplitServer server(o);
  inproc::LocalTransport transport(server);
  client::SplitClient client(ClientFor(dir, "bf16", 4), testing::ParityDataset(16), transport);
  client.Run();
  EXPECT_EQ(server.Stats().at("client-0").steps, 4);
}

// AMAQ against bf16 on short runs while AMAQ pushes the bits from 8 to 3, with gradients as the
// study chose for every quantized method (4-bit per-token symmetric): on the activations' own 3-bit
// per-channel grid, training collapsed in 16 of the study's 50 runs, and this test, then on one
// seed, failed on one CPU (AVX-512 BF16: 1.12 against bf16's 0.15) and passed on another. Asserted
// on the mean training loss of steps 50-59: averaged over three seeds, AMAQ within 0.2 nats of
// bf16; for each seed within 0.6 (a collapse is ~1), below half its own start, and at 3.5 bits or
// less. Measured on a 2-vCPU AMD EPYC (AVX-512 BF16), LibTorch 1.13, 1 and 2 threads alike:
// AMAQ - bf16 = +0.005, +0.210, -0.048 (seeds 7, 8, 9), mean +0.056; 3.0-3.2 bits. LibTorch 2.13, 1
// and 2 threads alike: +0.055, +0.024, -0.584 (bf16's seed 9 ended at 0.66), mean -0.17; 3.0-3.25 bits.
TEST(SplitTraining, AmaqStaysWithinAMarginOfBf16) {
  constexpr double kMeanMargin = 0.2, kSeedMargin = 0.6;
  const std::string dir = testing::TinyModelDir("amaq-vs-bf16");
  struct Tail {
    double start = 0, end = 0, bits = 0;
  };
  const auto run = [&](const std::string& method, int64_t seed) {
    server::ServerOptions so = ServerFor(dir);
    so.seed = seed;
    server::SplitServer server(so);
    inproc::LocalTransport transport(server);
    client::ClientOptions o = ClientFor(dir, method, 60);
    o.seed = seed;
    o.method_settings.Set("amaq_gate_lr", 0.2);
    o.method_settings.Set("amaq_beta", 1.0);
    client::SplitClient client(o, testing::ParityDataset(48), transport);
    client.Run();
    Tail t;
    for (int i = 0; i < 10; ++i) t.start += client.records()[static_cast<size_t>(i)].loss / 10;
    for (int i = 50; i < 60; ++i) t.end += client.records()[static_cast<size_t>(i)].loss / 10;
    t.bits = client.records()[59].average_bits;
    return t;
  };
  double mean_difference = 0;
  for (const int64_t seed : {7, 8, 9}) {
    const Tail bf16 = run("bf16", seed), amaq = run("amaq:8->3:grad=4:token:symmetric", seed);
    std::cout << "seed " << seed << ": bf16 steps 0-9 " << bf16.start << ", 50-59 " << bf16.end << "; amaq steps 0-9 "
              << amaq.start << ", 50-59 " << amaq.end << " at " << amaq.bits << " bits\n";
    mean_difference += (amaq.end - bf16.end) / 3;
    EXPECT_LT(amaq.end, bf16.end + kSeedMargin) << "seed " << seed;
    EXPECT_LT(amaq.end, 0.5 * amaq.start) << "seed " << seed << ": training stopped";
    EXPECT_LE(amaq.bits, 3.5) << "seed " << seed << ": the widths did not come down";
  }
  EXPECT_LT(mean_difference, kMeanMargin) << "AMAQ's mean loss over three seeds, minus bf16's";
}

// "past tense of <verb>:" -> "<verb>ed": a generation task for exact-match evaluation.
Dataset PastTenseDataset() {
  Dataset d;
  d.name = "past-tense";
  const char* verbs[] = {"walk", "jump", "talk", "play", "call", "look", "want", "open", "help", "work"};
  for (const char* v : verbs) d.train.push_back({std::string("past tense of ") + v + ":", std::string(v) + "ed", -1});
  d.validation = d.train;
  return d;
}

// A transport that records the next tokens of every NEXT_TOKEN reply, and can say it decodes
// without a cache (an older server) or lose the server's cache once (a restart mid-decoding).
struct DecodingTransport : inproc::LocalTransport {
  DecodingTransport(server::SplitServer& server, bool cache) : inproc::LocalTransport(server), cache_(cache), server_(server) {}
  bool server_decodes_with_cache() const override { return cache_; }
  StepResult Step(const StepInput& input) override {
    if (input.cache == DecodeCache::kExtend && lose_cache_once) {
      lose_cache_once = false;
      server_.Join(joined_.client_id, joined_.fingerprint, joined_.cut_layer, joined_.method);  // drops the cache
    }
    StepResult r = inproc::LocalTransport::Step(input);
    if (input.kind == StepKind::kNextToken) {
      tokens.insert(tokens.end(), r.next_tokens.begin(), r.next_tokens.end());
      ++(input.cache == DecodeCache::kStart ? starts : input.cache == DecodeCache::kExtend ? extends : whole);
    }
    return r;
  }
  int64_t Join(const JoinInfo& info) override {
    joined_ = info;
    return inproc::LocalTransport::Join(info);
  }
  std::vector<int64_t> tokens;
  int starts = 0, extends = 0, whole = 0;
  bool lose_cache_once = false;

 private:
  bool cache_;
  server::SplitServer& server_;
  JoinInfo joined_;
};

// Exact match through the split model with a cache on both sides picks, step for step, the tokens
// that sending every sequence whole picks, with far fewer bytes; a server that lost its cache
// mid-decoding is sent the sequences again, and the tokens stay the same.
TEST(SplitTraining, CachedSplitDecodingPicksTheTokensOfWholeSequences) {
  const std::string dir = testing::TinyModelDir("split-decoding");
  const Dataset data = PastTenseDataset();
  std::vector<int64_t> reference;
  uint64_t whole_bytes = 0;
  for (const int mode : {0, 1, 2}) {  // whole sequences; cached; cached, the server losing its cache once
    server::SplitServer server(ServerFor(dir));
    DecodingTransport transport(server, mode != 0);
    transport.lose_cache_once = mode == 2;
    // fp32 at the cut: a quantized method scales each message's channels over the rows it holds,
    // so one new row per sequence is rounded otherwise than whole sequences are.
    client::ClientOptions o = ClientFor(dir, "fp32", 4);
    o.eval_batch = 4;
    o.eval_examples = 10;
    client::SplitClient c(o, data, transport);
    for (int64_t step = c.Join(); step < 4; ++step) c.TrainStep(step);
    const uint64_t before = transport.bytes_up();
    c.Evaluate();
    ASSERT_FALSE(transport.tokens.empty());
    if (mode == 0) {
      reference = transport.tokens;
      whole_bytes = transport.bytes_up() - before;
      EXPECT_EQ(transport.starts + transport.extends, 0);
      continue;
    }
    EXPECT_EQ(transport.tokens, reference) << "mode " << mode;
    EXPECT_EQ(transport.whole, 0);
    EXPECT_EQ(transport.starts, mode == 1 ? 3 : 4) << "three batches of prompts (and one restart)";
    if (mode == 1) {
      EXPECT_LT(transport.bytes_up() - before, whole_bytes / 2) << "a new token sends one row per sequence";
    }
  }
}

// What the server refuses of cached decoding, each leaving it able to start again.
TEST(SplitTraining, CachedDecodingStepsAreChecked) {
  const std::string dir = testing::TinyModelDir("split-decoding-guards");
  server::SplitServer server(ServerFor(dir));
  server.Join("c", ModelFingerprint(dir, 2), 2, "fp32");
  const ModelConfig c = ModelConfig::Load(dir + "/config.json");
  const auto step = [&](DecodeCache cache, std::vector<int32_t> mask, int64_t tokens) {
    StepInput in;
    in.kind = StepKind::kNextToken;
    in.cache = cache;
    in.batch = static_cast<int64_t>(mask.size()) / tokens;
    in.tokens = tokens;
    in.mask = mask;
    in.labels.assign(mask.size(), -100);
    const std::vector<float> x(mask.size() * static_cast<size_t>(c.hidden_size), 0.1f);
    in.activation = quant::Method::Parse("fp32")->MakeClientCodec(quant::CodecContext{})->EncodeEvaluation(
        torch::tensor(x).reshape({static_cast<int64_t>(mask.size()), c.hidden_size}));
    return server.Step("c", in);
  };
  const auto code = [&](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code([&] { step(DecodeCache::kExtend, {1}, 1); }), ErrorCode::kFailedPrecondition) << "nothing started";
  EXPECT_EQ(code([&] { step(DecodeCache::kStart, {1, 1, 0}, 3); }), ErrorCode::kInvalidArgument) << "right padding";
  EXPECT_EQ(step(DecodeCache::kStart, {0, 1, 1}, 3).next_tokens.size(), 1u);
  EXPECT_EQ(code([&] { step(DecodeCache::kExtend, {1, 1}, 2); }), ErrorCode::kInvalidArgument) << "two tokens at once";
  EXPECT_EQ(code([&] { step(DecodeCache::kExtend, {1, 1}, 1); }), ErrorCode::kInvalidArgument) << "another batch";
  EXPECT_EQ(code([&] { step(DecodeCache::kExtend, {1}, 1); }), ErrorCode::kFailedPrecondition) << "the failure dropped the cache";
  EXPECT_EQ(step(DecodeCache::kStart, {1, 1, 1}, 3).next_tokens.size(), 1u);
  EXPECT_EQ(step(DecodeCache::kExtend, {1}, 1).next_tokens.size(), 1u);
  step(DecodeCache::kNone, {1, 1}, 2);  // any other step ends the decoding
  EXPECT_EQ(code([&] { step(DecodeCache::kExtend, {1}, 1); }), ErrorCode::kFailedPrecondition);
}

TEST(SplitTraining, CollaborativeModeAveragesClientAdapters) {
  const std::string dir = testing::TinyModelDir("collab");
  server::SplitServer server(ServerFor(dir));
  const std::string fp = ModelFingerprint(dir, 2);
  inproc::LocalTransport transport(server);
  client::SplitClient a(testing::TinyClientOptions(dir, "a", "bf16", 4), testing::ParityDataset(16), transport);
  a.Join();
  server.Join("b", fp, 2, "bf16");
  NamedFloats ones = a.Adapter(), threes = ones;  // the LoRA of the client's layers 0 and 1
  for (auto& [name, t] : ones) std::fill(t.values.begin(), t.values.end(), 1.0f);
  for (auto& [name, t] : threes) std::fill(t.values.begin(), t.values.end(), 3.0f);
  int clients = 0;
  server.AverageAdapters("a", ones, &clients);
  EXPECT_EQ(clients, 1);
  const NamedFloats mean = server.AverageAdapters("b", threes, &clients);
  EXPECT_EQ(clients, 2);
  ASSERT_EQ(mean.size(), ones.size());
  for (const auto& [name, t] : mean) EXPECT_EQ(t.values, std::vector<float>(t.values.size(), 2.0f)) << name;
  EXPECT_THROW(server.AverageAdapters("stranger", ones, &clients), Error);
  EXPECT_THROW(server.AverageAdapters("a", {{"w", {{2}, {1.0f, 2.0f}}}}, &clients), Error) << "not the client layers' LoRA";

  // Two clients through the whole path: after both synced, the second holds the mean of what both
  // uploaded (the first synced alone: it got its own back).
  struct Recording : inproc::LocalTransport {
    using inproc::LocalTransport::LocalTransport;
    NamedFloats SyncAdapters(const NamedFloats& adapter) override {
      uploads.push_back(adapter);
      return inproc::LocalTransport::SyncAdapters(adapter);
    }
    std::vector<NamedFloats> uploads;
  };
  server::SplitServer fresh(ServerFor(dir));
  Recording ta(fresh), tb(fresh);
  client::ClientOptions oa = testing::TinyClientOptions(dir, "a", "bf16", 4), ob = testing::TinyClientOptions(dir, "b", "bf16", 4);
  oa.sync_every = ob.sync_every = 4;
  ob.seed = 8;  // another initialisation and data order: other adapters before the sync
  client::SplitClient ca(oa, testing::ParityDataset(16), ta), cb(ob, testing::ParityDataset(16), tb);
  ca.Run();
  cb.Run();
  ASSERT_EQ(ta.uploads.size(), 1u);
  ASSERT_EQ(tb.uploads.size(), 1u);
  const NamedFloats &ua = ta.uploads[0], &ub = tb.uploads[0];
  ASSERT_EQ(ua.size(), ones.size());
  bool differ = false;
  for (const auto& [name, t] : cb.Adapter()) {
    const std::vector<float>&a_values = ua.at(name).values, &b_values = ub.at(name).values;
    ASSERT_EQ(t.values.size(), a_values.size()) << name;
    for (size_t i = 0; i < t.values.size(); ++i) {
      ASSERT_NEAR(t.values[i], (a_values[i] + b_values[i]) / 2, 1e-6) << name << "[" << i << "]";
    }
    differ = differ || a_values != b_values;
  }
  EXPECT_TRUE(differ) << "the clients' uploads must differ for the mean to show";
  for (const auto& [name, t] : ca.Adapter()) EXPECT_EQ(t.values, ua.at(name).values) << name << ": alone, a keeps its own";
}

// The adapter uploads of collaborative mode live in the server's checkpoint: after a restart the
// first sync averages with what the other clients uploaded before it.
TEST(SplitTraining, AdapterUploadsSurviveAServerRestart) {
  const std::string dir = testing::TinyModelDir("collab-restart");
  server::ServerOptions options = ServerFor(dir);
  options.checkpoint_dir = testing::TempDir("collab-restart-ckpt");
  const std::string fp = ModelFingerprint(dir, 2);
  NamedFloats threes, fives;
  {
    server::SplitServer server(options);
    inproc::LocalTransport transport(server);
    client::SplitClient a(testing::TinyClientOptions(dir, "a", "bf16", 4), testing::ParityDataset(16), transport);
    a.Join();
    server.Join("b", fp, 2, "bf16");
    threes = fives = a.Adapter();
    for (auto& [name, t] : threes) std::fill(t.values.begin(), t.values.end(), 3.0f);
    for (auto& [name, t] : fives) std::fill(t.values.begin(), t.values.end(), 5.0f);
    int clients = 0;
    server.AverageAdapters("b", threes, &clients);
    server.Checkpoint();
  }
  server::SplitServer restarted(options);
  restarted.Join("a", fp, 2, "bf16");
  int clients = 0;
  const NamedFloats mean = restarted.AverageAdapters("a", fives, &clients);
  EXPECT_EQ(clients, 2) << "b's upload from before the restart counts";
  ASSERT_EQ(mean.size(), fives.size());
  for (const auto& [name, t] : mean) {
    EXPECT_EQ(t.shape, fives.at(name).shape) << name;
    EXPECT_EQ(t.values, std::vector<float>(t.values.size(), 4.0f)) << name;
  }
}

// A transport whose server goes away for good at one training step (the client process dies
// there: what it has not checkpointed is lost).
struct DyingTransport : inproc::LocalTransport {
  DyingTransport(server::SplitServer& server, int64_t dies_at) : inproc::LocalTransport(server), dies_at(dies_at) {}
  StepResult Step(const StepInput& input) override {
    if (input.kind == StepKind::kTrain && input.step_id == dies_at) throw Error(ErrorCode::kInternal, "the client died");
    return inproc::LocalTransport::Step(input);
  }
  int64_t dies_at;
};

// The average bits of each training step a client's run sent, by step (its last attempt).
std::map<int64_t, double> BitsByStep(const client::SplitClient& c, int64_t steps) {
  std::map<int64_t, double> bits;
  for (const client::StepRecord& r : c.records()) {
    if (r.step < steps) bits[r.step] = r.average_bits;
  }
  return bits;
}

// AQ-SGD's caches are kept with both sides' checkpoints, each entry tagged with the frame that set
// it. A server restarted from a checkpoint older than the client's, and a client restarted from one
// older than the server's, each resume with the deltas of the samples both sides agree on; a step
// with a sample they do not agree on is refused and sent again in full, once. 32 examples in
// batches of 8: an epoch is 4 steps, so without the saved caches the first epoch after a restart
// would go in full.
TEST(SplitTraining, AqsgdCachesSurviveRestartsOfEitherSide) {
  const std::string dir = testing::TinyModelDir("aqsgd-restart");
  const Dataset data = testing::ParityDataset(32);
  server::ServerOptions so = ServerFor(dir);
  so.checkpoint_dir = testing::TempDir("aqsgd-restart-server");
  so.checkpoint_every = 10;
  client::ClientOptions co = ClientFor(dir, "aqsgd:4", 12);
  co.checkpoint_dir = testing::TempDir("aqsgd-restart-client");
  co.checkpoint_every = 4;
  co.history_every = 4;         // the cache with every checkpoint
  co.accept_divergence = true;  // the restarted client is 3 steps behind the server (below)
  {
    server::SplitServer server(so);  // checkpoints after step 9; steps 10 and 11 are lost with it
    inproc::LocalTransport transport(server);
    client::SplitClient client(co, data, transport);
    client.Run();
    const std::map<int64_t, double> bits = BitsByStep(client, 12);
    EXPECT_EQ(bits.at(0), 16) << "a first visit goes in full";
    EXPECT_EQ(bits.at(4), 4) << "a second visit is a delta";
  }
  server::SplitServer restarted(so);
  {
    co.steps = 24;
    DyingTransport transport(restarted, 19);  // the client's last checkpoint is of step 16
    client::SplitClient client(co, data, transport);
    EXPECT_THROW(client.Run(), Error);
    const std::map<int64_t, double> bits = BitsByStep(client, 24);
    EXPECT_EQ(bits.at(10), 16) << "replayed for the server, whose cache is of step 9: refused, then in full";
    EXPECT_EQ(bits.at(11), 16);
    for (int64_t step = 12; step < 19; ++step) EXPECT_EQ(bits.at(step), 4) << "step " << step;
  }
  inproc::LocalTransport transport(restarted);
  client::SplitClient client(co, data, transport);
  client.Run();
  const std::map<int64_t, double> bits = BitsByStep(client, 24);
  EXPECT_EQ(bits.at(16), 4) << "replayed for the client from its checkpoint: the very frame the server took before";
  for (int64_t step = 17; step < 19; ++step) {
    EXPECT_EQ(bits.at(step), 16) << "step " << step << ", replayed for the client on other weights: refused, then in full";
  }
  for (int64_t step = 19; step < 24; ++step) EXPECT_EQ(bits.at(step), 4) << "step " << step;
  EXPECT_EQ(restarted.Stats().at("client-0").steps, 24) << "each step applied once";
}

// The runs of a CSV's rows, in the file's order: its second last column (client/run_csv.h); the
// last, the server, is empty in process.
std::vector<std::string> CsvRuns(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, client::RunCsv::kHeader);
  std::vector<std::string> runs;
  while (std::getline(in, line)) {
    EXPECT_EQ(line.back(), ',') << "no server in process: " << line;
    const size_t end = line.size() - 1;
    runs.push_back(line.substr(line.rfind(',', end - 1) + 1, end - line.rfind(',', end - 1) - 1));
  }
  return runs;
}

// Issue 55 item 2: every run appended to one CSV is told apart by its run column: a restart that
// continues the run keeps its label, a --fresh run gets a new one; a CSV of an older amaq (no run
// column, or no server column) is refused before anything is written to it.
TEST(SplitTraining, EachRunOfACsvHasItsOwnLabel) {
  const std::string dir = testing::TinyModelDir("csv-runs");
  const Dataset data = testing::ParityDataset(32);
  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  client::ClientOptions o = ClientFor(dir, "fp32", 2);
  o.checkpoint_dir = testing::TempDir("csv-runs-client");
  o.csv_path = testing::TempDir("csv-runs-csv") + "/runs/client-0.csv";  // its folder is made
  client::SplitClient(o, data, transport).Run();
  o.steps = 3;  // the same run, one step more
  client::SplitClient(o, data, transport).Run();
  o.fresh = true;
  client::SplitClient(o, data, transport).Run();
  const std::vector<std::string> runs = CsvRuns(o.csv_path);
  ASSERT_EQ(runs.size(), 3u + 2u + 4u) << "2 steps and an evaluation, 1 step and one, 3 steps and one";
  EXPECT_EQ(runs[0].size(), std::string("2026-12-07T02:40:26.123Z").size()) << runs[0];
  EXPECT_TRUE(std::all_of(runs.begin(), runs.begin() + 5, [&](const std::string& r) { return r == runs[0]; }))
      << "the continued run keeps its label";
  EXPECT_NE(runs[5], runs[0]) << "the fresh run is another";
  EXPECT_TRUE(std::all_of(runs.begin() + 5, runs.end(), [&](const std::string& r) { return r == runs[5]; }));

  const std::string columns =
      "client,method,step,wire_up_bytes,wire_down_bytes,up_payload_bytes,up_metadata_bytes,down_payload_bytes,"
      "down_metadata_bytes,loss,average_bits,metric,seconds,applied";
  for (const std::string& old_csv : {columns + "\nclient-0,fp32,1,10,10,0,0,0,0,1.0,32,,0.1,1\n",
                                     columns + ",run\nclient-0,fp32,1,10,10,0,0,0,0,1.0,32,,0.1,1,2026-12-07T02:40:26.123Z\n"}) {
    const std::string old = testing::TempDir("csv-runs-old") + "/client-0.csv";
    std::ofstream(old) << old_csv;
    o.csv_path = old;
    try {
      client::SplitClient(o, data, transport);
      ADD_FAILURE() << "an older amaq's CSV was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
      EXPECT_NE(std::string(e.what()).find("without the run or server column"), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::filesystem::file_size(old), old_csv.size()) << "nothing was appended to it";
  }
}

// Issue 55 item 5: training examples longer than max_tokens (a 5 MB line trained as its last 64
// tokens without a word) are named in a warning: how many of how many, and the longest; data that
// fits says nothing.
TEST(SplitTraining, ExamplesLongerThanMaxTokensAreNamed) {
  const std::string dir = testing::TinyModelDir("long-examples");
  server::SplitServer server(ServerFor(dir));
  inproc::LocalTransport transport(server);
  const auto warnings = [&](const Dataset& data) {
    std::ostringstream log;
    const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
    client::ClientOptions o = ClientFor(dir, "fp32", 1);
    o.max_tokens = 24;
    client::SplitClient c(o, data, transport);
    spdlog::set_default_logger(previous);
    return log.str();
  };
  Dataset data = testing::ParityDataset(32);
  EXPECT_EQ(warnings(data).find("longer than max_tokens"), std::string::npos) << "short examples fit";
  std::string long_prompt;
  for (int i = 0; i < 500; ++i) long_prompt += "one two three ";
  data.train[3].prompt = long_prompt;
  data.train[9].prompt = long_prompt.substr(0, 200);
  const std::string said = warnings(data);
  EXPECT_NE(said.find("2 of 32 training examples are longer than max_tokens (24; the longest has "), std::string::npos) << said;
  EXPECT_NE(said.find("raise max_tokens"), std::string::npos) << said;
}

// A new run under a client_id the server (or checkpoint_dir) holds another run of is refused, with
// what differs and how to go on; resume continues the stored state; fresh discards it on both
// sides, so the fresh run trains exactly as it would against a new server.
TEST(SplitTraining, RunsNeverMixSilently) {
  const std::string dir = testing::TinyModelDir("runs");
  const Dataset data = testing::ParityDataset(32);
  server::ServerOptions so = ServerFor(dir);
  so.checkpoint_dir = testing::TempDir("runs-server");
  auto server_of_the_runs = std::make_unique<server::SplitServer>(so);  // one server on its checkpoint_dir at a time
  server::SplitServer& server = *server_of_the_runs;
  inproc::LocalTransport transport(server);
  client::ClientOptions first = ClientFor(dir, "fp32", 3);
  first.checkpoint_dir = testing::TempDir("runs-client");
  client::SplitClient(first, data, transport).Run();
  const auto refusal = [&](client::ClientOptions o) {
    try {
      client::SplitClient(o, data, transport).Run();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << e.what();
      return std::string(e.what());
    }
    return std::string("no refusal");
  };

  client::ClientOptions other = first;  // another seed, another checkpoint_dir: only the server knows the old run
  other.seed = 8;
  other.checkpoint_dir = testing::TempDir("runs-client-other");
  const std::string from_server = refusal(other);
  EXPECT_NE(from_server.find("seed 7 -> 8"), std::string::npos) << from_server;
  EXPECT_NE(from_server.find("resume: true"), std::string::npos) << from_server;
  EXPECT_NE(from_server.find("fresh: true"), std::string::npos) << from_server;
  EXPECT_EQ(server.Stats().at("client-0").steps, 3) << "the refusal left the stored run as it was";
  client::ClientOptions same_run = first;
  EXPECT_EQ(refusal(same_run), "no refusal") << "the same run continues automatically";
  same_run.checkpoint_dir = "";  // the same run without its checkpoints: 3 steps behind the server
  EXPECT_NE(refusal(same_run).find("keeps the answers to its last 2 steps only"), std::string::npos)
      << "replaying them would train the client on answers of the server's newer weights";

  other.checkpoint_dir = first.checkpoint_dir;  // the client's own checkpoint refuses it before any Join
  const std::string from_checkpoint = refusal(other);
  EXPECT_NE(from_checkpoint.find(first.checkpoint_dir), std::string::npos) << from_checkpoint;
  EXPECT_NE(from_checkpoint.find("seed 7 -> 8"), std::string::npos) << from_checkpoint;

  client::ClientOptions resumed = other;
  resumed.resume = true;
  resumed.steps = 4;
  client::SplitClient(resumed, data, transport).Run();
  EXPECT_EQ(server.Stats().at("client-0").steps, 4) << "resume continued the stored run: one more step";
  server.Checkpoint();  // holds the resumed run's 4 steps

  client::ClientOptions fresh = other;
  fresh.fresh = true;
  client::SplitClient fresh_client(fresh, data, transport);
  fresh_client.Run();
  EXPECT_EQ(server.Stats().at("client-0").steps, 3) << "fresh started at step 0";
  server::SplitServer new_server(ServerFor(dir));
  inproc::LocalTransport new_transport(new_server);
  other.checkpoint_dir = "";
  client::SplitClient reference(other, data, new_transport);
  reference.Run();
  ASSERT_EQ(fresh_client.records().size(), reference.records().size());
  for (size_t i = 0; i < reference.records().size(); ++i) {
    const float want = reference.records()[i].loss;  // a kept LoRA would move it by far more
    EXPECT_NEAR(fresh_client.records()[i].loss, want, 1e-5f * std::fabs(want) + 1e-6f) << "step " << i;
  }
  server_of_the_runs.reset();
  server::SplitServer restarted(so);  // fresh wrote the checkpoint without the discarded run
  EXPECT_EQ(restarted.Stats().count("client-0"), 0u);

  // A fresh run of other settings stopped before its first step (issue 55 item 2): the next plain
  // run continues it, not the run it discarded (before, the old checkpoint stayed and refused it).
  inproc::LocalTransport restarted_transport(restarted);
  client::ClientOptions seed9 = first;  // its checkpoint_dir holds the seed-8 run
  seed9.seed = 9;
  seed9.fresh = true;
  std::atomic<int> stop{SIGINT};
  seed9.stop = &stop;
  EXPECT_THROW(client::SplitClient(seed9, data, restarted_transport).Run(), client::Interrupted);
  seed9.fresh = false;
  seed9.stop = nullptr;
  client::SplitClient plain(seed9, data, restarted_transport);
  EXPECT_NO_THROW(plain.Run());
  EXPECT_EQ(plain.records().front().step, 0);
}

// An evicted session's AQ-SGD cache goes to its file with it and comes back with the Join: the
// next epoch after the eviction is all deltas.
TEST(SplitTraining, AnEvictedAqsgdSessionKeepsItsCache) {
  const std::string dir = testing::TinyModelDir("aqsgd-evict");
  const Dataset data = testing::ParityDataset(32);  // 4 steps an epoch
  server::ServerOptions so = ServerFor(dir);
  so.checkpoint_dir = testing::TempDir("aqsgd-evict-server");
  so.session_ttl_seconds = 1e-9;  // every session without a stream is idle
  client::ClientOptions co = ClientFor(dir, "aqsgd:4", 4);
  co.checkpoint_dir = testing::TempDir("aqsgd-evict-client");
  server::SplitServer server(so);
  inproc::LocalTransport transport(server);
  client::SplitClient(co, data, transport).Run();
  ASSERT_EQ(server.EvictIdle({}), 1);
  co.steps = 8;
  client::SplitClient client(co, data, transport);
  client.Run();
  const std::map<int64_t, double> bits = BitsByStep(client, 8);
  for (int64_t step = 4; step < 8; ++step) EXPECT_EQ(bits.at(step), 4) << "step " << step;
}

// A server (or a peer through it) that returns a non-finite average: the client refuses all of it
// and keeps its own weights (the poisoned tensor is the last one, so a partial copy would show).
TEST(SplitTraining, NonFiniteAdapterAverageIsRefusedByTheClient) {
  struct PoisonedAverage : inproc::LocalTransport {
    using inproc::LocalTransport::LocalTransport;
    NamedFloats SyncAdapters(const NamedFloats& adapter) override {
      NamedFloats average = inproc::LocalTransport::SyncAdapters(adapter);
      average.rbegin()->second.values[0] = std::nanf("");
      return average;
    }
  };
  const std::string dir = testing::TinyModelDir("poisoned-average");
  server::SplitServer server(ServerFor(dir));
  PoisonedAverage transport(server);
  client::SplitClient c(testing::TinyClientOptions(dir, "a", "bf16", 2), testing::ParityDataset(16), transport);
  c.Join();
  c.TrainStep(0);
  const NamedFloats before = c.Adapter();
  try {
    c.SyncAdapters();
    ADD_FAILURE() << "a NaN in the average must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
  }
  for (const auto& [name, t] : c.Adapter()) EXPECT_EQ(t.values, before.at(name).values) << name;
}

class ServerGuards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TinyModelDir("guards");
    server_ = std::make_unique<server::SplitServer>(ServerFor(dir_));
    fingerprint_ = ModelFingerprint(dir_, 2);
    server_->Join("c", fingerprint_, 2, "fp32");
  }
  // A valid fp32 training step of one 4-token sequence.
  StepInput Valid(int64_t step) {
    StepInput in;
    in.step_id = step;
    in.batch = 1;
    in.tokens = 4;
    in.mask = {1, 1, 1, 1};
    in.labels = {-100, 5, 6, 7};
    std::vector<float> x(4 * 32, 0.1f);
    quant::EncodeOptions o;
    o.scheme = quant::Scheme::kFloat32;
    in.activation = quant::Encoder().Encode(x.data(), 4, 32, quant::BitsTable{}, o).bytes;
    return in;
  }
  ErrorCode CodeOf(const StepInput& in) {
    try {
      server_->Step("c", in);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  }
  std::string dir_, fingerprint_;
  std::unique_ptr<server::SplitServer> server_;
};

// Parts of a step (micro-batches): fields out of range are refused, a part that comes without
// its predecessors is refused until the step starts again from its first part, a repeated part is
// answered from the store and not added twice, and the step applies with its last part.
TEST_F(ServerGuards, MicroBatchesComeInOrderAndApplyOnce) {
  const auto part = [&](int64_t step, int32_t index, int32_t count, float scale) {
    StepInput in = Valid(step);
    in.micro_batch = index;
    in.micro_batches = count;
    in.loss_scale = scale;
    return in;
  };
  EXPECT_EQ(CodeOf(part(0, 2, 2, 0.5f)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(part(0, 0, kMaxMicroBatches + 1, 0.5f)), ErrorCode::kInvalidArgument);
  for (float scale : {0.0f, 1.5f, std::nanf("")}) EXPECT_EQ(CodeOf(part(0, 0, 2, scale)), ErrorCode::kInvalidArgument) << scale;
  EXPECT_EQ(CodeOf(part(0, 1, 2, 0.5f)), ErrorCode::kFailedPrecondition) << "part 1 before part 0";

  const StepResult first = server_->Step("c", part(0, 0, 2, 0.5f));
  EXPECT_FALSE(first.duplicate);
  EXPECT_EQ(server_->Stats().at("c").steps, 0) << "not applied before its last part";
  const StepResult repeated = server_->Step("c", part(0, 0, 2, 0.5f));
  EXPECT_TRUE(repeated.duplicate);
  EXPECT_EQ(repeated.gradient, first.gradient);
  EXPECT_EQ(CodeOf(part(0, 1, 3, 0.5f)), ErrorCode::kFailedPrecondition) << "another split of the step";
  const StepResult last = server_->Step("c", part(0, 1, 2, 0.5f));
  EXPECT_FALSE(last.duplicate);
  EXPECT_EQ(server_->Stats().at("c").steps, 1);
  EXPECT_FLOAT_EQ(server_->Stats().at("c").last_loss, first.loss + last.loss);
  EXPECT_TRUE(server_->Step("c", part(0, 0, 2, 0.5f)).duplicate) << "a retry of the applied step's parts";
  EXPECT_TRUE(server_->Step("c", part(0, 1, 2, 0.5f)).duplicate);
  EXPECT_EQ(server_->Stats().at("c").steps, 1);

  // A step sent again in another split (a restarted client) starts afresh with its first part.
  server_->Step("c", part(1, 0, 2, 0.5f));
  EXPECT_FALSE(server_->Step("c", part(1, 0, 3, 0.25f)).duplicate);
  server_->Step("c", part(1, 1, 3, 0.25f));
  EXPECT_EQ(server_->Stats().at("c").steps, 1);
  server_->Step("c", part(1, 2, 3, 0.5f));
  EXPECT_EQ(server_->Stats().at("c").steps, 2);

  server::ServerOptions shared = ServerFor(dir_);
  shared.shared_lora = true;
  server::SplitServer one_lora(shared);
  one_lora.Join("c", fingerprint_, 2, "fp32");
  try {
    one_lora.Step("c", part(0, 0, 2, 0.5f));
    ADD_FAILURE() << "a shared LoRA took a part of a step";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("micro_batches 1"), std::string::npos) << e.what();
  }
}

// A client one step stale has two steps in flight: when a link breaks after the server applied
// both, the older step's retry is answered from the store (its own loss, not a replay on the
// newer weights), as is the newer's; three steps back is a replay, answered but not applied.
TEST_F(ServerGuards, TheLastTwoAppliedStepsAreAnsweredFromTheStore) {
  std::vector<StepResult> firsts;
  for (int64_t step = 0; step < 3; ++step) firsts.push_back(server_->Step("c", Valid(step)));
  EXPECT_EQ(server_->Stats().at("c").steps, 3);
  for (int64_t step : {1, 2}) {
    const StepResult again = server_->Step("c", Valid(step));
    EXPECT_TRUE(again.duplicate) << "step " << step;
    EXPECT_EQ(again.loss, firsts[static_cast<size_t>(step)].loss) << "step " << step;
    EXPECT_EQ(again.gradient, firsts[static_cast<size_t>(step)].gradient) << "step " << step;
  }
  const StepResult replay = server_->Step("c", Valid(0));
  EXPECT_NE(replay.loss, firsts[0].loss) << "step 0 computed again on the weights of three steps later";
  EXPECT_EQ(server_->Stats().at("c").steps, 3) << "nothing applied twice";
}

// The stored answers are in the checkpoint: a client killed after the server applied its step,
// before its own checkpoint held it, sends the step again to a restarted server and gets the
// answer it lost (not one computed on the newer weights), so its own update is the one it lost.
TEST_F(ServerGuards, ARestartedServerAnswersTheLastStepsAsBefore) {
  server::ServerOptions o = ServerFor(dir_);
  o.checkpoint_dir = testing::TempDir("server-answers");
  o.checkpoint_every = 1;
  std::vector<StepResult> firsts;
  {
    server::SplitServer before(o);
    before.Join("c", fingerprint_, 2, "fp32");
    for (int64_t step = 0; step < 3; ++step) firsts.push_back(before.Step("c", Valid(step)));
  }
  server::SplitServer restarted(o);
  EXPECT_EQ(restarted.Join("c", fingerprint_, 2, "fp32"), 2);
  for (int64_t step : {1, 2}) {
    const StepResult again = restarted.Step("c", Valid(step));
    EXPECT_TRUE(again.duplicate) << "step " << step;
    EXPECT_EQ(again.loss, firsts[static_cast<size_t>(step)].loss) << "step " << step;
    EXPECT_EQ(again.gradient, firsts[static_cast<size_t>(step)].gradient) << "step " << step;
  }
  EXPECT_EQ(restarted.Stats().at("c").steps, 3) << "nothing applied twice";
}

TEST_F(ServerGuards, StepsApplyOnceAndInOrder) {
  const StepResult first = server_->Step("c", Valid(0));
  EXPECT_FALSE(first.duplicate);
  const StepResult again = server_->Step("c", Valid(0));
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.gradient, first.gradient);
  EXPECT_EQ(server_->Stats().at("c").steps, 1);
  EXPECT_EQ(CodeOf(Valid(5)), ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(server_->Step("c", Valid(1)).duplicate);
}

// A client whose reply was lost rejoins (fresh codec streams) and sends the step again: it gets the
// same gradient, encoded on the new stream, and the step is not applied twice.
TEST_F(ServerGuards, RetryAfterRejoinGetsTheSameGradient) {
  server_->Join("m", fingerprint_, 2, "amaq:8->3");
  std::vector<float> x(4 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.3f - 1.0f;
  std::vector<uint8_t> widths(32);
  for (size_t c = 0; c < widths.size(); ++c) widths[c] = static_cast<uint8_t>(3 + c % 6);
  StepInput in = Valid(0);
  in.activation = quant::Encoder().Encode(x.data(), 4, 32, quant::BitsTable::PerChannel(widths), quant::EncodeOptions{}).bytes;
  const StepResult first = server_->Step("m", in);
  quant::Decoder before;
  const std::vector<float> g1 = before.Decode(first.gradient.data(), first.gradient.size()).values;
  EXPECT_EQ(server_->Join("m", fingerprint_, 2, "amaq:8->3"), 0);
  const StepResult again = server_->Step("m", in);
  EXPECT_TRUE(again.duplicate);
  quant::Decoder fresh;  // the rejoined client's new stream
  EXPECT_EQ(fresh.Decode(again.gradient.data(), again.gradient.size()).values, g1);
  EXPECT_EQ(server_->Stats().at("m").steps, 1);
}

// A client restarted from an older checkpoint replays steps the server applied: they are answered
// without being applied, and must not replace the stored answer to the last applied step.
TEST_F(ServerGuards, ReplaysOfOlderStepsAreAnsweredButNotApplied) {
  for (int64_t step = 0; step < 4; ++step) server_->Step("c", Valid(step));
  for (int64_t step = 1; step < 3; ++step) {
    const StepResult replay = server_->Step("c", Valid(step));
    EXPECT_TRUE(replay.duplicate);
    EXPECT_EQ(replay.step_id, step);
  }
  const StepResult last = server_->Step("c", Valid(3));
  EXPECT_TRUE(last.duplicate);
  EXPECT_EQ(last.step_id, 3) << "the answer to step 3, not to the replay of step 2";
  EXPECT_EQ(server_->Stats().at("c").steps, 4);
  EXPECT_FALSE(server_->Step("c", Valid(4)).duplicate);
  EXPECT_EQ(server_->Stats().at("c").steps, 5);
}

TEST_F(ServerGuards, MalformedStepsAreRefusedAndStateIsKept) {
  StepInput bad = Valid(0);
  bad.activation[60] ^= 0xff;
  EXPECT_EQ(CodeOf(bad), ErrorCode::kDataLoss);
  bad = Valid(0);
  bad.tokens = 3;  // shape disagrees with mask and payload
  EXPECT_EQ(CodeOf(bad), ErrorCode::kInvalidArgument);
  bad = Valid(0);
  bad.labels[1] = 999;
  EXPECT_EQ(CodeOf(bad), ErrorCode::kInvalidArgument);
  bad = Valid(0);
  bad.mask[1] = 2;  // candidate segments are for SCORE steps only
  EXPECT_EQ(CodeOf(bad), ErrorCode::kInvalidArgument);
  // NaN activations: encoders refuse them, so patch one into a valid fp32 message and reseal it.
  bad = Valid(0);
  const float nan = std::nanf("");
  std::memcpy(bad.activation.data() + 48 + 4 * 7, &nan, 4);
  const uint64_t sum = quant::WireChecksum(bad.activation.data(), bad.activation.size() - 8);
  std::memcpy(bad.activation.data() + bad.activation.size() - 8, &sum, 8);
  EXPECT_EQ(CodeOf(bad), ErrorCode::kInvalidArgument);
  EXPECT_EQ(server_->Stats().at("c").steps, 0);
  server_->Step("c", Valid(0));
  EXPECT_EQ(server_->Stats().at("c").steps, 1);
  EXPECT_FALSE(server_->Step("c", Valid(1)).duplicate);  // still serving after the refusals
}

// SCORE steps score targets (docs/protocol.md): one score per row and candidate, each the sum of
// its targets' log-probabilities; targets outside the step, on padding, of unknown tokens or
// candidates, and labels on SCORE steps or targets on others are refused, and nothing changes.
TEST_F(ServerGuards, ScoreStepsScoreTheirTargetsAndBadTargetsAreRefused) {
  StepInput score = Valid(0);
  score.kind = StepKind::kScore;
  score.labels.clear();
  score.mask = {1, 1, 1, 0};
  score.targets = {{0, 1, 2, 2}, {5, 6, 7, 8}, {0, 0, 0, 1}, 2};
  const StepResult two = server_->Step("c", score);
  ASSERT_EQ(two.scores.size(), 2u);
  StepInput apart = score;  // candidate 0's three targets as three candidates: they sum to its score
  apart.targets = {{0, 1, 2}, {5, 6, 7}, {0, 1, 2}, 3};
  const StepResult three = server_->Step("c", apart);
  ASSERT_EQ(three.scores.size(), 3u);
  for (float s : three.scores) EXPECT_LT(s, 0.0f);
  EXPECT_NEAR(three.scores[0] + three.scores[1] + three.scores[2], two.scores[0], 1e-4);
  const auto refused = [&](const std::function<void(StepInput&)>& spoil) {
    StepInput bad = score;
    spoil(bad);
    return CodeOf(bad) == ErrorCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.positions[3] = 3; })) << "padding";
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.positions[3] = 4; })) << "outside batch x tokens";
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.tokens[0] = 999; })) << "above the vocabulary";
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.candidates[3] = 2; })) << "candidate beyond count";
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.count = 0; }));
  EXPECT_TRUE(refused([](StepInput& in) { in.targets.tokens.pop_back(); })) << "lists of different lengths";
  EXPECT_TRUE(refused([](StepInput& in) { in.targets = {}; in.targets.count = 1; })) << "no target";
  EXPECT_TRUE(refused([](StepInput& in) { in.labels = {-100, 5, 6, 7}; })) << "labels on a SCORE step";
  StepInput train = Valid(0);
  train.targets = score.targets;
  EXPECT_EQ(CodeOf(train), ErrorCode::kInvalidArgument) << "targets on a TRAIN step";
  EXPECT_EQ(server_->Stats().at("c").steps, 0);
  EXPECT_FALSE(server_->Step("c", Valid(0)).duplicate);
}

TEST_F(ServerGuards, RateLimitRefusesFastClients) {
  server::ServerOptions o = ServerFor(dir_);
  o.max_steps_per_second = 0.5;
  server::SplitServer limited(o);
  limited.Join("c", fingerprint_, 2, "fp32");
  const StepResult first = limited.Step("c", Valid(0));
  try {
    limited.Step("c", Valid(1));
    FAIL() << "expected RESOURCE_EXHAUSTED";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
  }
  EXPECT_EQ(limited.Stats().at("c").steps, 1);
  // A retry of the step just applied (its reply was lost, the client reconnected) applies nothing:
  // it is answered from the stored reply, within the limit.
  limited.Join("c", fingerprint_, 2, "fp32");
  const StepResult again = limited.Step("c", Valid(0));
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.gradient, first.gradient);
}

// Each refusal leaves the training state as it was: after all of them, the next step gives the
// same loss and gradient, bit for bit, as on a twin server that never saw them (so the LoRA and the
// optimizer's state are untouched), and the same counters.
TEST_F(ServerGuards, RefusedStepsLeaveNoTrace) {
  server::SplitServer twin(ServerFor(dir_));
  twin.Join("c", fingerprint_, 2, "fp32");
  server_->Step("c", Valid(0));
  twin.Step("c", Valid(0));
  std::vector<std::pair<std::string, StepInput>> refused;
  refused.emplace_back("a gap in step ids", Valid(5));
  refused.emplace_back("a label beyond the vocabulary", Valid(1));
  refused.back().second.labels[1] = 999;
  refused.emplace_back("a corrupted activation", Valid(1));
  refused.back().second.activation[60] ^= 0xff;
  refused.emplace_back("an activation of another shape", Valid(1));
  {
    std::vector<float> x(2 * 32, 0.1f);
    quant::EncodeOptions o;
    o.scheme = quant::Scheme::kFloat32;
    refused.back().second.activation = quant::Encoder().Encode(x.data(), 2, 32, quant::BitsTable{}, o).bytes;
  }
  refused.emplace_back("an activation whose loss or gradient is not finite", Valid(1));
  {
    std::vector<float> x(4 * 32, 3e38f);
    for (size_t i = 0; i < x.size(); i += 2) x[i] = -3e38f;
    quant::EncodeOptions o;
    o.scheme = quant::Scheme::kFloat32;
    refused.back().second.activation = quant::Encoder().Encode(x.data(), 4, 32, quant::BitsTable{}, o).bytes;
  }
  const server::ClientStats before = server_->Stats().at("c");
  std::string messages;
  for (const auto& [what, in] : refused) {
    try {
      server_->Step("c", in);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      messages += e.what() + std::string("\n");
    }
  }
  // The last one passed decoding and went through forward and backward (its loss or its gradient
  // is not finite): the stage that touches the optimizer's gradients.
  EXPECT_NE(messages.rfind("finite"), std::string::npos) << messages;
  EXPECT_GT(messages.rfind("finite"), messages.rfind("its step says")) << messages;
  const server::ClientStats after = server_->Stats().at("c");
  EXPECT_EQ(after.steps, before.steps);
  EXPECT_EQ(after.gradient_bytes, before.gradient_bytes);
  EXPECT_EQ(after.last_loss, before.last_loss);
  EXPECT_EQ(after.average_bits, before.average_bits);
  const StepResult mine = server_->Step("c", Valid(1)), theirs = twin.Step("c", Valid(1));
  EXPECT_FALSE(mine.duplicate);
  EXPECT_EQ(mine.loss, theirs.loss);
  EXPECT_EQ(mine.gradient, theirs.gradient);
}

TEST_F(ServerGuards, JoinChecksModelCutAndMethod) {
  const auto code = [&](const std::string& fp, int64_t cut, const std::string& method) {
    try {
      server_->Join("d", fp, cut, method);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code("0123456789abcdef", 2, "fp32"), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(code(fingerprint_, 1, "fp32"), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(code(ModelFingerprint(dir_, 2, BaseWeights::kNf4), 2, "fp32"), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(code(fingerprint_, 2, "int8"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(fingerprint_, 2, "bf16"), ErrorCode::kInternal);  // accepted
  EXPECT_EQ(code(fingerprint_, 2, "fp32"), ErrorCode::kInvalidArgument);  // d trained with bf16
}

// A restarted server continues exactly where it stopped: the step after the restart gives the
// same loss and gradient as on a server that never stopped (LoRA and optimizer state restored).
TEST_F(ServerGuards, CheckpointRestoresStepsAndAdapters) {
  server::ServerOptions o = ServerFor(dir_);
  o.checkpoint_dir = testing::TempDir("server-ckpt");
  server::SplitServer uninterrupted(ServerFor(dir_));
  uninterrupted.Join("c", fingerprint_, 2, "fp32");
  {
    server::SplitServer first(o);
    first.Join("c", fingerprint_, 2, "fp32");
    for (int64_t s = 0; s < 3; ++s) {
      first.Step("c", Valid(s));
      uninterrupted.Step("c", Valid(s));
    }
    first.Checkpoint();
  }
  server::SplitServer second(o);
  EXPECT_EQ(second.Join("c", fingerprint_, 2, "fp32"), 2);
  const StepResult retry = second.Step("c", Valid(2));  // applied before the restart
  EXPECT_TRUE(retry.duplicate);
  const StepResult next = second.Step("c", Valid(3)), reference = uninterrupted.Step("c", Valid(3));
  EXPECT_FALSE(next.duplicate);
  EXPECT_EQ(next.loss, reference.loss);
  EXPECT_EQ(next.gradient, reference.gradient);
  EXPECT_EQ(second.Stats().at("c").steps, 4);
}


// An idle session is written out and dropped; its client's Join brings it back with its step
// counter, LoRA and optimizer, so the next step is the one a server that kept it would compute.
TEST_F(ServerGuards, EvictedSessionsResumeExactlyOnJoin) {
  server::ServerOptions o = ServerFor(dir_);
  o.checkpoint_dir = testing::TempDir("server-evict");
  o.session_ttl_seconds = 1e-9;  // every session without a stream is idle
  server::SplitServer kept(ServerFor(dir_));
  kept.Join("c", fingerprint_, 2, "fp32");
  auto evicting_server = std::make_unique<server::SplitServer>(o);  // one server on its checkpoint_dir at a time
  server::SplitServer& evicting = *evicting_server;
  evicting.Join("c", fingerprint_, 2, "fp32");
  evicting.Join("connected", fingerprint_, 2, "fp32");
  for (int64_t s = 0; s < 2; ++s) {
    evicting.Step("c", Valid(s));
    kept.Step("c", Valid(s));
  }
  EXPECT_EQ(evicting.EvictIdle({"connected"}), 1);
  EXPECT_EQ(evicting.sessions_in_memory(), 1u);
  EXPECT_FALSE(evicting.Stats().count("c"));
  try {
    evicting.Step("c", Valid(2));
    ADD_FAILURE() << "a step of an evicted session must ask for a Join";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << e.what();  // the client rejoins on it
  }
  EXPECT_EQ(evicting.Join("c", fingerprint_, 2, "fp32"), 1);
  const StepResult next = evicting.Step("c", Valid(2)), reference = kept.Step("c", Valid(2));
  EXPECT_FALSE(next.duplicate);
  EXPECT_EQ(next.loss, reference.loss);
  EXPECT_EQ(next.gradient, reference.gradient);
  EXPECT_EQ(evicting.Stats().at("c").steps, 3);

  server::ServerOptions never = o;
  never.session_ttl_seconds = 1e6;
  evicting_server.reset();
  server::SplitServer patient(never);  // resumes "c" and "connected" from the checkpoint
  EXPECT_EQ(patient.EvictIdle({}), 0);
  o.checkpoint_dir.clear();
  try {
    server::SplitServer nowhere(o);
    ADD_FAILURE() << "a TTL without a checkpoint_dir would lose the evicted sessions";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

// The server stops between writing an evicted session and the checkpoint without it: on restart,
// the newer of the two copies wins, so no applied step is lost.
TEST_F(ServerGuards, AnEvictedSessionNewerThanTheCheckpointWins) {
  server::ServerOptions o = ServerFor(dir_);
  o.checkpoint_dir = testing::TempDir("server-evict-crash");
  o.checkpoint_every = 1;
  o.session_ttl_seconds = 1e-9;
  const std::string checkpoint = o.checkpoint_dir + "/server.pt", older = o.checkpoint_dir + "/older.pt";
  {
    server::SplitServer first(o);
    first.Join("c", fingerprint_, 2, "fp32");
    first.Step("c", Valid(0));
    std::filesystem::copy_file(checkpoint, older);  // holds c after 1 step
    first.Step("c", Valid(1));
    EXPECT_EQ(first.EvictIdle({}), 1);  // c after 2 steps in its own file
  }
  std::filesystem::rename(older, checkpoint);  // as if the stop came before the checkpoint
  server::SplitServer second(o);
  EXPECT_EQ(second.sessions_in_memory(), 0u) << "the checkpoint's older copy of c is not used";
  EXPECT_EQ(second.Join("c", fingerprint_, 2, "fp32"), 1);
  EXPECT_EQ(second.Stats().at("c").steps, 2);
  EXPECT_TRUE(second.Step("c", Valid(1)).duplicate);
}

}  // namespace
}  // namespace amaq
