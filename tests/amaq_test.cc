#include "quant/amaq_quantizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/base/error.h"
#include "quant/tensor_codec.h"

namespace amaq::quant {
namespace {

AmaqOptions Fp32Scales(AmaqOptions o = {}) {
  o.scale_format = ScaleFormat::kFloat32;  // exact steps, so finite differences can be compared
  return o;
}

TEST(Amaq, StartsAtBmaxAndMatchesTheWire) {
  torch::manual_seed(0);
  AmaqQuantizer amaq(12, AmaqOptions{});
  EXPECT_DOUBLE_EQ(amaq.AverageBits(), 8.0);
  const torch::Tensor x = torch::randn({20, 12});
  Encoder encoder;
  Encoded wire;
  const torch::Tensor x_hat = amaq.Quantize(x, encoder, &wire);
  Decoder decoder;
  const torch::Tensor received = DecodeTensor(decoder, wire.bytes.data(), wire.bytes.size());
  EXPECT_TRUE(torch::equal(received, x_hat)) << "the server must see exactly what the client trained on";
  EXPECT_DOUBLE_EQ(wire.average_bits, 8.0);
  EXPECT_LT((x_hat - x).abs().max().item<float>(), (x.max() - x.min()).item<float>() / 255);
}

TEST(Amaq, InputGradientIsStraightThrough) {
  AmaqQuantizer amaq(6, AmaqOptions{});
  const torch::Tensor x = torch::randn({10, 6}).requires_grad_(true);
  const torch::Tensor w = torch::randn({10, 6});
  Encoder encoder;
  (amaq.Quantize(x, encoder) * w).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), w));
}

// A client one step stale quantizes step t + 1 before step t's gradient arrives, then steps the
// gates in between: the later backward must run, and give the gate gradient of the gates its
// forward used (as if the step had not happened).
TEST(Amaq, ABackwardAfterTheGatesSteppedUsesTheGatesOfItsForward) {
  torch::manual_seed(3);
  AmaqOptions o = Fp32Scales();
  o.alpha = 0.7;
  const torch::Tensor first = torch::randn({30, 5}), second = torch::randn({30, 5}), w = torch::randn({30, 5});
  AmaqQuantizer stale(5, o), fresh(5, o);
  Encoder stale_encoder, fresh_encoder;
  const torch::Tensor a = stale.Quantize(first, stale_encoder);
  const torch::Tensor b = stale.Quantize(second, stale_encoder);
  (a * w).sum().backward();
  stale.Step();  // the gates change in place, and their gradient is cleared (zero in LibTorch 1.13, none in 2.x)
  ASSERT_NO_THROW((b * w).sum().backward());
  fresh.Quantize(first, fresh_encoder);  // the same stream position as `second` had
  (fresh.Quantize(second, fresh_encoder) * w).sum().backward();
  EXPECT_FALSE(torch::equal(stale.gates(), fresh.gates())) << "the step must have moved the gates";
  EXPECT_TRUE(torch::allclose(stale.gates().grad(), fresh.gates().grad(), 1e-6, 1e-7));
}

// The gate gradient is the LSQ estimator: the exact derivative of
//   h(q) = sum w * (x + step(b(q)) * (code - u0)),  b(q) = round(b_cont(q0)) + b_cont(q) - b_cont(q0)
// (codes frozen, rounding straight-through). Central differences of h must match it.
TEST(Amaq, GateGradientMatchesFiniteDifferences) {
  torch::manual_seed(1);
  AmaqOptions o = Fp32Scales();
  o.alpha = 0.7;
  AmaqQuantizer amaq(5, o);
  {
    torch::NoGradGuard no_grad;
    amaq.gates().copy_(torch::tensor({3.0f, 1.0f, 0.2f, -0.5f, -2.0f}));  // various widths
  }
  const torch::Tensor x = torch::randn({40, 5}, torch::kDouble).to(torch::kFloat);
  const torch::Tensor w = torch::randn({40, 5});
  Encoder encoder;
  const torch::Tensor x_hat = amaq.Quantize(x, encoder);
  (x_hat * w).sum().backward();
  const torch::Tensor analytic = amaq.gates().grad().clone();

  const torch::Tensor lo = std::get<0>(x.min(0)).to(torch::kDouble);
  const torch::Tensor hi = std::get<0>(x.max(0)).to(torch::kDouble);
  const torch::Tensor q0 = amaq.gates().detach().to(torch::kDouble);
  const auto b_cont = [&](const torch::Tensor& q) { return o.bmin + (o.bmax - o.bmin) * torch::sigmoid(o.alpha * q); };
  const torch::Tensor b0 = b_cont(q0).round();
  const auto step = [&](const torch::Tensor& q) {
    return (hi - lo) / (torch::pow(2.0, b0 + b_cont(q) - b_cont(q0)) - 1);
  };
  const torch::Tensor residual = (x_hat - x).to(torch::kDouble) / step(q0);  // code - u0
  const auto h = [&](const torch::Tensor& q) { return (w.to(torch::kDouble) * step(q) * residual).sum(); };
  const double eps = 1e-5;
  for (int64_t i = 0; i < 5; ++i) {
    torch::Tensor up = q0.clone(), down = q0.clone();
    up[i] += eps;
    down[i] -= eps;
    const double fd = ((h(up) - h(down)) / (2 * eps)).item<double>();
    EXPECT_NEAR(analytic[i].item<float>(), fd, 1e-3 * std::fabs(fd) + 1e-5) << "gate " << i;
  }
}

TEST(Amaq, RegularizerGradientMatchesFiniteDifferences) {
  AmaqOptions o;
  o.alpha = 1.3;
  o.beta = 0.5;
  AmaqQuantizer amaq(4, o);
  {
    torch::NoGradGuard no_grad;
    amaq.gates().copy_(torch::tensor({2.0f, 0.5f, -1.0f, 0.0f}));
  }
  amaq.Regularizer().backward();
  const torch::Tensor q0 = amaq.gates().detach().to(torch::kDouble);
  const auto r = [&](const torch::Tensor& q) { return o.beta * torch::sigmoid(o.alpha * q).pow(2).mean(); };
  for (int64_t i = 0; i < 4; ++i) {
    torch::Tensor up = q0.clone(), down = q0.clone();
    up[i] += 1e-6;
    down[i] -= 1e-6;
    const double fd = ((r(up) - r(down)) / 2e-6).item<double>();
    EXPECT_NEAR(amaq.gates().grad()[i].item<float>(), fd, 1e-5) << i;
  }
}

TEST(Amaq, PerTokenGatesRepeatEverySequence) {
  torch::manual_seed(2);
  AmaqOptions o = Fp32Scales();
  o.per_token = true;
  AmaqQuantizer amaq(4, o);  // sequence length 4
  {
    torch::NoGradGuard no_grad;
    amaq.gates().copy_(torch::tensor({4.0f, 0.0f, -1.0f, -4.0f}));
  }
  const BitsTable bits = amaq.IntegerBits(8);
  ASSERT_EQ(bits.layout, BitsLayout::kPerToken);
  ASSERT_EQ(bits.bits.size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(bits.bits[r], bits.bits[r % 4]);
  EXPECT_GT(bits.bits[0], bits.bits[3]);

  const torch::Tensor x = torch::randn({8, 6});
  const torch::Tensor w = torch::randn({8, 6});
  Encoder encoder;
  Encoded wire;
  (amaq.Quantize(x, encoder, &wire) * w).sum().backward();
  Decoder decoder;
  Decoded info;
  DecodeTensor(decoder, wire.bytes.data(), wire.bytes.size(), &info);
  EXPECT_EQ(info.granularity, Granularity::kToken);
  EXPECT_EQ(info.bits, bits);
  EXPECT_EQ(amaq.gates().grad().numel(), 4);
  EXPECT_THROW(amaq.Quantize(torch::randn({6, 6}), encoder), Error);  // not whole sequences
}

TEST(Amaq, BackwardQuantizationUsesTheSameBits) {
  torch::manual_seed(3);
  AmaqOptions o;
  o.quantize_backward = true;
  AmaqQuantizer amaq(8, o);
  {
    torch::NoGradGuard no_grad;
    amaq.gates().fill_(-3.0f);  // 3 bits everywhere: a visibly coarse gradient
  }
  const torch::Tensor x = torch::randn({16, 8}).requires_grad_(true);
  const torch::Tensor w = torch::randn({16, 8});
  Encoder encoder;
  (amaq.Quantize(x, encoder) * w).sum().backward();
  Encoder grad_encoder;
  torch::Tensor expected;
  EncodeTensor(grad_encoder, w, BitsTable::PerChannel(std::vector<uint8_t>(8, 3)), EncodeOptions{}, &expected);
  EXPECT_TRUE(torch::equal(x.grad(), expected));
  EXPECT_FALSE(torch::equal(x.grad(), w));
}

TEST(Amaq, BadOptionsAndShapesAreRefused) {
  AmaqOptions o;
  o.bmin = 8;
  EXPECT_THROW(AmaqQuantizer(4, o), Error);
  o = AmaqOptions{};
  o.gate_lr = 0;
  EXPECT_THROW(AmaqQuantizer(4, o), Error);
  o = AmaqOptions{};
  o.budget = BitBudgetOptions{2.0, 100, 0, 0.5};  // below bmin
  EXPECT_THROW(AmaqQuantizer(4, o), Error);
  o = AmaqOptions{};
  o.uniform = true;  // uniform needs a budget's schedule
  EXPECT_THROW(AmaqQuantizer(4, o), Error);
  AmaqQuantizer amaq(4, AmaqOptions{});
  Encoder encoder;
  EXPECT_THROW(amaq.Quantize(torch::randn({3, 5}), encoder), Error);
  EXPECT_THROW(amaq.Quantize(torch::randn({3}), encoder), Error);
  torch::Tensor bad = torch::randn({3, 4});
  bad[1][2] = std::nanf("");
  EXPECT_THROW(amaq.Quantize(bad, encoder), Error);
}

// ---- training: the behaviour AMAQ exists for ----

struct ToyResult {
  double first_loss, last_loss, average_bits;
  double important_bits, unimportant_bits;
};

// Linear regression y = x[:, :4] * W; only the first 4 of 16 channels matter. The input passes
// through AMAQ before a trainable linear layer.
ToyResult TrainToy(AmaqOptions o, int steps) {
  torch::manual_seed(4);
  const int64_t channels = 16, important = 4;
  const torch::Tensor w_true = torch::randn({important, 2});
  torch::nn::Linear model(channels, 2);
  torch::optim::Adam model_optimizer(model->parameters(), torch::optim::AdamOptions(0.02));
  AmaqQuantizer amaq(channels, o);
  Encoder encoder;
  ToyResult result{};
  double loss_sum = 0;
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor x = torch::randn({128, channels});
    const torch::Tensor y = x.slice(1, 0, important).mm(w_true);
    const torch::Tensor loss = torch::mse_loss(model(amaq.Quantize(x, encoder)), y);
    (loss + amaq.Regularizer()).backward();
    model_optimizer.step();
    model_optimizer.zero_grad();
    amaq.Step();
    loss_sum += loss.item<double>();
    if (step == 19) result.first_loss = loss_sum / 20;
    if (step >= steps - 20) result.last_loss += loss.item<double>() / 20;
  }
  const std::vector<uint8_t> sent = amaq.IntegerBits(1).bits;
  const torch::Tensor bits = torch::tensor(std::vector<float>(sent.begin(), sent.end()));
  result.average_bits = amaq.AverageBits();
  result.important_bits = bits.slice(0, 0, important).mean().item<double>();
  result.unimportant_bits = bits.slice(0, important).mean().item<double>();
  return result;
}

TEST(AmaqTraining, ImportantChannelsKeepMoreBitsWhileTheTaskTrains) {
  AmaqOptions o;  // the documented defaults
  const ToyResult r = TrainToy(o, 400);
  std::cout << "toy: loss " << r.first_loss << " -> " << r.last_loss << ", average bits "
            << r.average_bits << ", important " << r.important_bits << ", unimportant "
            << r.unimportant_bits << "\n";
  EXPECT_LT(r.average_bits, 5.0) << "bits must fall from 8 towards bmin";
  EXPECT_GE(r.important_bits, r.unimportant_bits + 2.0) << "channels that matter keep more bits";
  EXPECT_LT(r.last_loss, 0.05 * r.first_loss) << "the task must still train";
}

// The budget is met by allocation at every step after the descent, while the gates still decide
// which channels stay wide and the task trains.
TEST(AmaqTraining, BitBudgetIsMetAndAllocatedToTheChannelsThatMatter) {
  for (double target : {3.0, 3.5, 5.0}) {
    AmaqOptions o;
    o.budget = BitBudgetOptions{target, 400, 20, 0.5};
    const ToyResult r = TrainToy(o, 400);
    std::cout << "budget " << target << ": average " << r.average_bits << ", important " << r.important_bits
              << ", unimportant " << r.unimportant_bits << ", loss " << r.first_loss << " -> " << r.last_loss << "\n";
    EXPECT_NEAR(r.average_bits, target, 0.05);
    if (target > 3.0) {
      EXPECT_GT(r.important_bits, r.unimportant_bits) << "the learned gates must steer the allocation";
    }
    EXPECT_LT(r.last_loss, 0.1 * r.first_loss) << "the task must still train (at 3 bits every channel is at bmin)";
  }
}

TEST(AmaqTraining, UniformBudgetGivesEveryChannelTheScheduledWidth) {
  // Budgets 4 (integer) and 2.75 (between widths, channels down to 2 bits): at every step the
  // widths meet the schedule's average to one bit over all channels, differ by at most one bit
  // between channels, and the wider ones are the first (a fixed order, nothing learned).
  for (const auto& [bmin, target] : std::vector<std::pair<double, double>>{{3, 4.0}, {2, 2.75}}) {
    AmaqOptions o;
    o.bmin = bmin;
    o.budget = BitBudgetOptions{target, 100, 0, 0.5};
    o.uniform = true;
    constexpr int kChannels = 8;
    AmaqQuantizer amaq(kChannels, o);
    const torch::Tensor before = amaq.gates().detach().clone();
    Encoder encoder;
    for (int step = 0; step < 100; ++step) {
      const std::vector<uint8_t> bits = amaq.IntegerBits(1).bits;
      const double desired = BitBudget(bmin, 8, *o.budget).DesiredBits(step);
      EXPECT_NEAR(amaq.AverageBits(), desired, 0.5 / kChannels + 1e-9) << "step " << step;
      ASSERT_TRUE(std::is_sorted(bits.rbegin(), bits.rend())) << "step " << step << ": the first gates are the wide ones";
      ASSERT_LE(bits.front() - bits.back(), 1) << "step " << step;
      (amaq.Quantize(torch::randn({16, kChannels}), encoder) * torch::randn({16, kChannels})).sum().backward();
      amaq.Step();
    }
    EXPECT_TRUE(torch::equal(before, amaq.gates().detach())) << "uniform widths learn nothing";
    EXPECT_DOUBLE_EQ(amaq.AverageBits(), target);
  }
}

}  // namespace
}  // namespace amaq::quant
