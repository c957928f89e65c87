// Steps of several clients batched into one forward/backward on the server (SplitServer::StepBatch,
// StepWorker's PickBatch): each client gets what its steps would give run one after another, a
// refused step leaves the others' untouched, and no client waits behind another's queue.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/error.h"
#include "common/model/checkpoint.h"
#include "quant/method.h"
#include "server/split_server.h"
#include "server/step_worker.h"
#include "tiny_model.h"

namespace amaq {
namespace {

// One client's steps: its method, shape and padding, and both client codecs (one per server).
struct Tenant {
  std::string id, method;
  int64_t batch, tokens;
  int64_t left_pad = 0, right_pad = 0;  // padding of row 0 (the other rows are full)
  std::unique_ptr<quant::ClientCodec> codecs[2];
};

class Batching : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::TinyModelDir("batching"); }

  std::unique_ptr<server::SplitServer> NewServer(bool shared) {
    server::ServerOptions o = testing::TinyServerOptions(dir_);
    o.shared_lora = shared;
    o.max_grad_norm = 1.0;  // per LoRA, once per step: batching must not mix clients' norms
    return std::make_unique<server::SplitServer>(o);
  }

  void Join(server::SplitServer& server, Tenant& t, int side) {
    server.Join(t.id, ModelFingerprint(dir_, 2), 2, t.method);
    quant::CodecContext context;
    context.channels = server.config().hidden_size;
    t.codecs[side] = quant::Method::Parse(t.method)->MakeClientCodec(context);
  }

  // Step `step` of tenant t: random activations (the same on both sides), encoded by its codec for `side`.
  StepInput Input(Tenant& t, int64_t step, int side, int64_t hidden) {
    StepInput in;
    in.step_id = step;
    in.batch = t.batch;
    in.tokens = t.tokens;
    for (int64_t r = 0; r < t.batch; ++r) {
      for (int64_t j = 0; j < t.tokens; ++j) {
        const auto pad = [&](int64_t k) { return r == 0 && (k < t.left_pad || k >= t.tokens - t.right_pad); };
        in.mask.push_back(pad(j) ? 0 : 1);
        // A token is predicted from the one before it: none for the first, none after padding.
        const bool predicted = j > 0 && !pad(j) && !pad(j - 1);
        in.labels.push_back(predicted ? static_cast<int32_t>((7 * r + 3 * j + step) % 300) : -100);
      }
    }
    torch::manual_seed(static_cast<uint64_t>(1000 * step + std::hash<std::string>{}(t.id) % 997));
    const torch::Tensor x = torch::randn({t.batch * t.tokens, hidden});
    torch::Tensor upstream;
    in.activation = t.codecs[side]->EncodeTraining(x, quant::SampleRows{t.batch, t.tokens, {}}, &upstream).bytes;
    return in;
  }

  std::string dir_;
};

// The largest difference between two adapters, relative to the largest value.
double RelativeDifference(const ServerAdapterInfo& a, const ServerAdapterInfo& b) {
  double diff = 0, scale = 0;
  for (const auto& [name, t] : a.tensors) {
    const auto& u = b.tensors.at(name).values;
    for (size_t i = 0; i < t.values.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(t.values[i] - u[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(t.values[i])));
    }
  }
  return diff / scale;
}

TEST_F(Batching, BatchedStepsEqualTheSameStepsOneAfterAnother) {
  auto serial = NewServer(false);
  auto batched = NewServer(false);
  const int64_t hidden = serial->config().hidden_size;
  std::vector<Tenant> tenants;
  tenants.push_back({"a", "fp32", 2, 6, 0, 2, {}});
  tenants.push_back({"b", "amaq:8->3", 1, 4, 0, 0, {}});
  tenants.push_back({"c", "fp32", 3, 5, 2, 0, {}});
  tenants.push_back({"d", "bf16", 2, 3, 0, 0, {}});
  tenants.push_back({"e", "fixed:4:channel:grad=8", 1, 6, 0, 0, {}});
  for (Tenant& t : tenants) {
    Join(*serial, t, 0);
    Join(*batched, t, 1);
  }
  const ServerAdapterInfo untouched = batched->AdapterOf("d");
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<StepInput> inputs;
    std::vector<StepResult> alone;
    for (Tenant& t : tenants) {
      inputs.push_back(Input(t, step, 1, hidden));
      // Client d's activation is cut short on the batched server: refused mid-batch, every step.
      if (t.id == "d") {
        inputs.back().activation.resize(inputs.back().activation.size() / 2);
        alone.emplace_back();
        continue;
      }
      alone.push_back(serial->Step(t.id, Input(t, step, 0, hidden)));
      EXPECT_FALSE(alone.back().duplicate);
    }
    std::vector<server::SplitServer::BatchEntry> batch;
    for (size_t i = 0; i < tenants.size(); ++i) batch.push_back({tenants[i].id, &inputs[i], {}, nullptr});
    batched->StepBatch(batch);
    for (size_t i = 0; i < tenants.size(); ++i) {
      Tenant& t = tenants[i];
      if (t.id == "d") {
        ASSERT_TRUE(batch[i].error) << "a cut-short activation must be refused";
        continue;
      }
      ASSERT_FALSE(batch[i].error) << t.id;
      EXPECT_NEAR(batch[i].result.loss, alone[i].loss, 1e-5 * std::fabs(alone[i].loss)) << t.id << " step " << step;
      quant::ByteCount count;
      const int64_t rows = t.batch * t.tokens;
      const torch::Tensor g_alone = t.codecs[0]->DecodeGradient(alone[i].gradient, rows, hidden, &count);
      const torch::Tensor g_batched = t.codecs[1]->DecodeGradient(batch[i].result.gradient, rows, hidden, &count);
      const double scale = g_alone.abs().max().item<double>();
      ASSERT_GT(scale, 0) << t.id;
      // fp32 gradients to fp32 rounding; a quantized gradient may round an element to the next level.
      const double tolerance = t.method == "fp32" ? 1e-5 : 0.2;
      EXPECT_LE((g_batched - g_alone).abs().max().item<double>(), tolerance * scale) << t.id << " step " << step;
      // AdamW divides each element's moment by its own size, so the rounding of the rows' padding
      // (softmax and attention sums over more keys, exact zeros added in another order) reaches
      // the update of an element with a tiny gradient at full size: 1e-4 of the largest value.
      EXPECT_LT(RelativeDifference(serial->AdapterOf(t.id), batched->AdapterOf(t.id)), 1e-4) << t.id << " step " << step;
    }
  }
  for (const Tenant& t : tenants) {
    if (t.id == "d") continue;
    EXPECT_EQ(batched->Stats().at(t.id).steps, 3) << t.id;
    EXPECT_GT(RelativeDifference(untouched, batched->AdapterOf(t.id)), 1e-3) << t.id << " trained";
  }
  EXPECT_EQ(batched->Stats().at("d").steps, 0);
  EXPECT_EQ(RelativeDifference(untouched, batched->AdapterOf("d")), 0) << "nothing of the refused steps is applied";
}

// With one LoRA for all clients, a batch is one optimizer step over the sum of its steps' losses:
// each step is computed from the state before the batch, and the LoRA moves once.
TEST_F(Batching, ASharedLoraBatchIsOneStepOverTheSummedLoss) {
  std::vector<Tenant> tenants;
  tenants.push_back({"a", "fp32", 2, 6, 0, 1, {}});
  tenants.push_back({"b", "fp32", 1, 4, 0, 0, {}});
  auto batched = NewServer(true);
  const int64_t hidden = batched->config().hidden_size;
  std::vector<StepInput> inputs;
  std::vector<server::SplitServer::BatchEntry> batch;
  std::vector<StepResult> alone;
  for (Tenant& t : tenants) {
    auto fresh = NewServer(true);  // the state before the batch, for this step alone
    Join(*fresh, t, 0);
    alone.push_back(fresh->Step(t.id, Input(t, 0, 0, hidden)));
    Join(*batched, t, 1);
    inputs.push_back(Input(t, 0, 1, hidden));
  }
  const ServerAdapterInfo before = batched->AdapterOf("a");
  for (size_t i = 0; i < tenants.size(); ++i) batch.push_back({tenants[i].id, &inputs[i], {}, nullptr});
  batched->StepBatch(batch);
  for (size_t i = 0; i < tenants.size(); ++i) {
    ASSERT_FALSE(batch[i].error);
    EXPECT_NEAR(batch[i].result.loss, alone[i].loss, 1e-5 * std::fabs(alone[i].loss));
    EXPECT_EQ(batched->Stats().at(tenants[i].id).steps, 1);
  }
  // AdamW's first step moves each element by lr (times m/sqrt(v) = sign of the gradient, for the
  // elements with a gradient); two steps would move some by up to 2 lr.
  double largest = 0;
  const ServerAdapterInfo after = batched->AdapterOf("b");
  for (const auto& [name, t] : after.tensors) {
    for (size_t i = 0; i < t.values.size(); ++i) {
      largest = std::max(largest, static_cast<double>(std::fabs(t.values[i] - before.tensors.at(name).values[i])));
    }
  }
  EXPECT_GT(largest, 0.5e-2);
  EXPECT_LT(largest, 1.01e-2);
  EXPECT_TRUE(after.shared);
}

}  // namespace

namespace server {
namespace {

QueuedStep Queued(const std::string& client, int64_t step, int64_t rows, int64_t tokens, StepKind kind = StepKind::kTrain) {
  QueuedStep q;
  q.client_id = client;
  q.input.step_id = step;
  q.input.batch = rows;
  q.input.tokens = tokens;
  q.input.kind = kind;
  return q;
}

TEST(PickBatch, OldestFirstOneStepPerClientWithinTheTokenLimit) {
  std::deque<QueuedStep> queue;
  queue.push_back(Queued("a", 0, 4, 10));
  queue.push_back(Queued("a", 1, 4, 10));   // a's next step waits for the next batch
  queue.push_back(Queued("b", 0, 2, 10));
  queue.push_back(Queued("c", 0, 1, 10, StepKind::kScore));  // evaluation runs alone
  queue.push_back(Queued("e", 0, 2, 30));   // (4 + 2 + 2) x 30 tokens padded: over 200
  queue.push_back(Queued("f", 0, 4, 12));   // (4 + 2 + 4) x 12 = 120
  queue.push_back(Queued("g", 0, 1, 20));   // (10 + 1) x 20 = 220: over
  queue.push_back(Queued("h", 0, 1, 8));    // 11 x 12 = 132
  EXPECT_EQ(PickBatch(queue, 200), (std::vector<size_t>{0, 2, 5, 7}));
  EXPECT_EQ(PickBatch(queue, 0), (std::vector<size_t>{0})) << "0: every step alone";
  EXPECT_EQ(PickBatch(queue, 40), (std::vector<size_t>{0})) << "(4 + 2) x 10 = 60 > 40: the oldest goes alone all the same";
  queue.pop_front();
  queue.pop_front();
  queue.pop_front();
  EXPECT_EQ(PickBatch(queue, 1000), (std::vector<size_t>{0})) << "an evaluation step at the head runs alone";
  EXPECT_TRUE(PickBatch({}, 1000).empty());
}

// A client with many queued steps cannot hold back one with a single step: with a FIFO of single
// steps, b's step would wait behind all of a's.
TEST(PickBatch, AClientWithAQueueDoesNotStarveAnother) {
  std::deque<QueuedStep> queue;
  for (int64_t s = 0; s < 20; ++s) queue.push_back(Queued("fast", s, 1, 8));
  queue.push_back(Queued("slow", 0, 1, 8));
  std::vector<std::string> order;
  while (!queue.empty()) {
    const std::vector<size_t> picked = PickBatch(queue, 1 << 20);
    for (const size_t i : picked) order.push_back(queue[i].client_id + ":" + std::to_string(queue[i].input.step_id));
    for (auto it = picked.rbegin(); it != picked.rend(); ++it) queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(*it));
  }
  ASSERT_EQ(order.size(), 21u);
  EXPECT_TRUE(order[0] == "slow:0" || order[1] == "slow:0") << "slow's step runs in the first batch";
  std::vector<int64_t> fast;
  for (const std::string& s : order) {
    if (s.rfind("fast:", 0) == 0) fast.push_back(std::stoll(s.substr(5)));
  }
  EXPECT_TRUE(std::is_sorted(fast.begin(), fast.end())) << "a client's steps keep their order";
}

}  // namespace
}  // namespace server
}  // namespace amaq
