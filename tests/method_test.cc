// quant/method.h and the codecs each method makes (quant/cut_codec.h), client and server halves
// talking to each other without a model or a network.
#include "quant/method.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

TEST(Method, ParsesEveryFormToItsCanonicalName) {
  const std::pair<const char*, const char*> forms[] = {
      {"fp32", "fp32"}, {"none", "fp32"}, {"bf16", "bf16"}, {"fixed:3", "fixed:3:channel"},
      {"fixed:4:group", "fixed:4:group:128"}, {"amaq", "amaq:8->3"}, {"amaq:6->4", "amaq:6->4"},
      {"amaq:budget=3.50", "amaq:budget=3.5"}, {"amaq:8->3:budget=3", "amaq:budget=3"}, {"aqsgd:4:grad=6", "aqsgd:4:grad=6"},
      {"fixed:3:grad=4:symmetric:token", "fixed:3:channel:grad=4:token:symmetric"}};
  for (const auto& [text, canonical] : forms) EXPECT_EQ(Method::Parse(text)->ToString(), canonical) << text;
  for (const char* text : {"bf16", "fixed:4:channel", "fixed:3:group:128", "fixed:2:tensor", "fixed:4:token", "amaq:8->3",
                           "amaq:budget=3.5", "aqsgd:4", "amaq:budget=3:uniform", "amaq:8->2:budget=3:grad=4:token:symmetric",
                           "amaq:8->2:budget=2.75:uniform:grad=4:token:symmetric", "amaq:budget=4:grad=8",
                           "fixed:3:channel:grad=8", "fixed:4:group:64:grad=6", "aqsgd:4:grad=6", "fixed:3:channel:grad=4:token",
                           "amaq:budget=3:grad=3:symmetric", "fixed:3:channel:grad=4:token:symmetric:stochastic"}) {
    EXPECT_EQ(Method::Parse(text)->ToString(), text);
    EXPECT_EQ(std::string(text).find(','), std::string::npos) << "method names go into CSV files unquoted";
  }
  EXPECT_NE(Method::Parse("amaq:8->2:budget=3")->ToString(), Method::Parse("amaq:budget=3")->ToString())
      << "a budget with room below it is another method than the default range's";
  EXPECT_EQ(*Method::Parse("amaq:budget=3.5")->target_bits(), 3.5);
  EXPECT_FALSE(Method::Parse("amaq:8->3")->target_bits());
}

TEST(Method, RefusesBadFormsWithTheAllowedOnes) {
  for (const char* text : {"", "int8", "fixed", "fixed:9", "fixed:0", "fixed:4:row", "fixed:4:channel:8",
                           "amaq:3->8", "amaq:9->3", "amaq:budget=2", "amaq:uniform", "amaq:budget=3:grad=9", "amaq:budget=3:wide", "bf16:grad=8",
                           "amaq:grad=8:uniform", "amaq:8->2:6->2:budget=3", "amaq:budget=3:budget=4", "amaq:budget=3:uniform:uniform",
                           "amaq:8->2:budget=3:uniform:uniform", "aqsgd:1", "aqsgd", "fixed:x", "bf16:4", "fixed:4:group:0",
                           "fixed:3:grad=4:row", "fixed:3:grad=4:token,token", "fixed:3:grad=:token", "bf16:grad=4:token"}) {
    try {
      Method::Parse(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << text;
      EXPECT_NE(std::string(e.what()).find("use fp32 | bf16 | fp16 | fixed:"), std::string::npos) << e.what();
    }
  }
}

// One training exchange between the two halves of a method: the activation the server decodes
// and the gradient message it answers with (decoded as the client would).
struct Exchange {
  std::vector<float> activation;  // as the server decoded it
  Decoded activation_message;     // header and widths of the activation as sent
  Decoded gradient_message;
  torch::Tensor gradient;         // as the client decoded it
};

torch::Tensor TestActivation() {
  torch::manual_seed(3);
  return torch::randn({2 * 4, 16});
}

// Both halves of a method, for activations of `channels` channels.
struct Halves {
  std::unique_ptr<ClientCodec> client;
  std::unique_ptr<ServerCodec> server;
};

Halves MakeHalves(const std::string& method, int64_t channels) {
  CodecContext context;
  context.channels = channels;
  context.steps = 10;
  const auto m = Method::Parse(method);
  return Halves{m->MakeClientCodec(context), m->MakeServerCodec(context)};
}

Exchange RunExchange(const std::string& method, const torch::Tensor& x = TestActivation()) {
  const auto [client, server] = MakeHalves(method, x.size(1));
  const SampleRows rows{2, 4, {10, 11}};
  torch::Tensor upstream;
  const Encoded up = client->EncodeTraining(x, rows, &upstream);
  Exchange e;
  e.activation = server->DecodeTraining(up.bytes.data(), up.bytes.size(), rows, x.size(1)).values;
  if (method.rfind("aqsgd", 0) != 0) e.activation_message = Decoder().Decode(up.bytes.data(), up.bytes.size());
  const torch::Tensor g = torch::linspace(-1, 1, x.numel()).view(x.sizes()).contiguous();
  const Encoded down = server->EncodeGradient(g.data_ptr<float>(), x.size(0), x.size(1));
  e.gradient_message = Decoder().Decode(down.bytes.data(), down.bytes.size());
  ByteCount count;
  e.gradient = client->DecodeGradient(down.bytes, x.size(0), x.size(1), &count);
  EXPECT_EQ(count.total(), down.bytes.size()) << method;
  return e;
}

TEST(MethodCodecs, TheServerDecodesWhatTheClientSentAndAnswersInTheMethodsFormat) {
  const torch::Tensor x = TestActivation();
  for (const char* method : {"fp32", "bf16", "fp16", "fixed:8:channel", "fixed:4:token", "fixed:3:group:8",
                             "amaq:8->3", "amaq:budget=4:grad=8", "aqsgd:4"}) {
    const Exchange e = RunExchange(method, x);
    ASSERT_EQ(e.activation.size(), static_cast<size_t>(x.numel())) << method;
    const torch::Tensor decoded = torch::from_blob(const_cast<float*>(e.activation.data()), x.sizes(), torch::kFloat);
    EXPECT_LT((decoded - x).abs().max().item<float>(), 0.5f) << method;  // 3 bits over a range of ~7
    EXPECT_EQ(e.gradient.sizes(), x.sizes()) << method;
  }
  // The gradient's format follows the method (docs/amaq.md).
  EXPECT_EQ(RunExchange("fp32").gradient_message.scheme, Scheme::kFloat32);
  EXPECT_EQ(RunExchange("bf16").gradient_message.scheme, Scheme::kBFloat16);
  const Exchange amaq = RunExchange("amaq:8->3");
  EXPECT_EQ(amaq.gradient_message.bits, amaq.activation_message.bits) << "AMAQ answers with the activation's widths";
  EXPECT_EQ(RunExchange("amaq:budget=4:grad=8").gradient_message.bits, BitsTable::Uniform(8));
  const Exchange fixed = RunExchange("fixed:3:channel:grad=8");
  EXPECT_EQ(fixed.activation_message.bits, BitsTable::Uniform(3));
  EXPECT_EQ(fixed.gradient_message.bits, BitsTable::Uniform(8));
  EXPECT_EQ(RunExchange("fixed:4:token").gradient_message.granularity, Granularity::kToken);
  const Exchange aqsgd = RunExchange("aqsgd:3");
  EXPECT_EQ(aqsgd.gradient_message.bits, BitsTable::Uniform(8));
  EXPECT_EQ(aqsgd.gradient_message.granularity, Granularity::kChannel);
  // :grad= options set the gradient's scales and grid, whatever the activation's are.
  for (const char* method : {"fixed:3:channel:grad=4:token:symmetric", "amaq:8->3:grad=4:token:symmetric",
                             "aqsgd:4:grad=4:token:symmetric"}) {
    const Exchange e = RunExchange(method);
    EXPECT_EQ(e.gradient_message.bits, BitsTable::Uniform(4)) << method;
    EXPECT_EQ(e.gradient_message.granularity, Granularity::kToken) << method;
    EXPECT_EQ(e.gradient_message.scheme, Scheme::kSymmetric) << method;
  }
}

// The symmetric grid keeps zero exact, which the affine grid over [min, max] does not.
TEST(MethodCodecs, ASymmetricGradientGridSendsZerosAsZeros) {
  const auto [client, server] = MakeHalves("fixed:3:channel:grad=3:symmetric", 4);
  const auto [affine_client, affine_server] = MakeHalves("fixed:3:channel:grad=3", 4);
  const torch::Tensor x = torch::randn({3, 4});
  const SampleRows rows{1, 3, {1}};
  // A row of zeros between ranges that do not start at 0, so that 0 is not an affine code.
  const torch::Tensor g = torch::tensor({{1.0f, -0.7f, 0.9f, -1.1f}, {0.0f, 0.0f, 0.0f, 0.0f}, {-0.45f, 0.3f, -0.5f, 0.45f}});
  std::vector<float> decoded_zeros;
  for (auto* halves : {&client, &affine_client}) {
    ClientCodec& c = **halves;
    ServerCodec& s = halves == &client ? *server : *affine_server;
    torch::Tensor upstream;
    const Encoded up = c.EncodeTraining(x, rows, &upstream);
    s.DecodeTraining(up.bytes.data(), up.bytes.size(), rows, 4);
    const Encoded down = s.EncodeGradient(g.data_ptr<float>(), 3, 4);
    ByteCount count;
    const torch::Tensor back = c.DecodeGradient(down.bytes, 3, 4, &count);
    decoded_zeros.push_back(back[1].abs().max().item<float>());
  }
  EXPECT_EQ(decoded_zeros[0], 0.0f) << "symmetric";
  EXPECT_GT(decoded_zeros[1], 0.01f) << "affine over [min, max] has no code at 0 here";
}

// Stochastic rounding draws new noise for every gradient message, so its mean over messages
// converges on the gradient (nearest rounding repeats the same error every time).
TEST(MethodCodecs, StochasticGradientsAreUnbiasedAcrossMessages) {
  const auto [client, server] = MakeHalves("fixed:8:channel:grad=2:symmetric:stochastic", 1);
  const SampleRows rows{1, 2, {1}};
  const torch::Tensor x = torch::randn({2, 1});
  const torch::Tensor g = torch::tensor({{1.0f}, {0.3f}});  // 2-bit symmetric codes: -1, 0, +1
  double sum = 0;
  std::vector<float> first_values;
  const int messages = 400;
  for (int i = 0; i < messages; ++i) {
    torch::Tensor upstream;
    const Encoded up = client->EncodeTraining(x, rows, &upstream);
    server->DecodeTraining(up.bytes.data(), up.bytes.size(), rows, 1);
    const Encoded down = server->EncodeGradient(g.data_ptr<float>(), 2, 1);
    ByteCount count;
    const float v = client->DecodeGradient(down.bytes, 2, 1, &count)[1][0].item<float>();
    sum += v;
    if (i < 8) first_values.push_back(v);
  }
  EXPECT_NE(*std::min_element(first_values.begin(), first_values.end()),
            *std::max_element(first_values.begin(), first_values.end()))
      << "every message rounds the same way";
  EXPECT_NEAR(sum / messages, 0.3, 0.08);  // 0 or 1 with p = 0.3: standard error 0.023
}

// After a reconnect both sides start fresh streams: each part of the last two steps (a client one
// step stale has both in flight), encoded again in order, decodes on the server's new stream as it
// did on the old one (AQ-SGD resends its self-contained frames); older steps are gone.
TEST(MethodCodecs, TheLastTwoStepsPartsAreSentAgainOnAFreshStream) {
  const torch::Tensor x = TestActivation();
  const torch::Tensor other = x.flip({0}) * 0.5;  // another part: other values, other samples
  const torch::Tensor third = x * -0.25;
  for (const char* method : {"fixed:4:channel", "amaq:8->3", "aqsgd:4", "bf16"}) {
    const auto [client, server] = MakeHalves(method, x.size(1));
    const SampleRows part0{2, 4, {10, 11}, 0, 7}, part1{2, 4, {12, 13}, 1, 7}, next0{2, 4, {14, 15}, 0, 8};
    torch::Tensor upstream;
    const Encoded first = client->EncodeTraining(x, part0, &upstream);
    const Encoded second = client->EncodeTraining(other, part1, &upstream);
    const Encoded next = client->EncodeTraining(third, next0, &upstream);
    const auto decoded0 = server->DecodeTraining(first.bytes.data(), first.bytes.size(), part0, x.size(1)).values;
    const auto decoded1 = server->DecodeTraining(second.bytes.data(), second.bytes.size(), part1, x.size(1)).values;
    const auto decoded_next = server->DecodeTraining(next.bytes.data(), next.bytes.size(), next0, x.size(1)).values;
    client->Reset();
    server->Reset();
    const std::vector<uint8_t> again0 = client->EncodeTrainingAgain(7, 0);
    const std::vector<uint8_t> again1 = client->EncodeTrainingAgain(7, 1);
    const std::vector<uint8_t> again_next = client->EncodeTrainingAgain(8, 0);
    EXPECT_EQ(server->DecodeTraining(again0.data(), again0.size(), part0, x.size(1)).values, decoded0) << method;
    EXPECT_EQ(server->DecodeTraining(again1.data(), again1.size(), part1, x.size(1)).values, decoded1) << method;
    EXPECT_EQ(server->DecodeTraining(again_next.data(), again_next.size(), next0, x.size(1)).values, decoded_next) << method;
    EXPECT_THROW(client->EncodeTrainingAgain(7, 2), Error) << method << ": a part never encoded";
    EXPECT_THROW(client->EncodeTrainingAgain(8, 1), Error) << method << ": a part never encoded";
    client->EncodeTraining(x, SampleRows{2, 4, {10, 11}, 0, 9}, &upstream);
    EXPECT_NO_THROW(client->EncodeTrainingAgain(8, 0)) << method << ": the step before the last";
    EXPECT_THROW(client->EncodeTrainingAgain(7, 0), Error) << method << ": two steps back";
    EXPECT_THROW(client->EncodeTraining(x, SampleRows{2, 4, {10, 11}, 2, 9}, &upstream), Error)
        << method << ": part 2 of a step after its part 0 alone";
  }
}

TEST(MethodCodecs, AServerCodecRefusesAnActivationOfAnotherShape) {
  const torch::Tensor x = TestActivation();
  for (const char* method : {"fixed:4:channel", "aqsgd:4"}) {
    const auto [client, server] = MakeHalves(method, x.size(1));
    torch::Tensor upstream;
    const Encoded up = client->EncodeTraining(x, SampleRows{2, 4, {10, 11}}, &upstream);
    EXPECT_THROW(server->DecodeTraining(up.bytes.data(), up.bytes.size(), SampleRows{1, 4, {10}}, x.size(1)), Error) << method;  // 4 rows, not 8
  }
}

// A method added from outside (here, by this test): its own classes and one registration; the
// factory then parses it like the built-in ones.
class HalfCast : public Method {
 public:
  std::string ToString() const override { return "half-cast"; }
  std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext&) const override {
    EncodeOptions o;
    o.scheme = Scheme::kFloat16;
    return std::make_unique<PlainClientCodec>(o, BitsTable{});
  }
  std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext&) const override {
    struct Answer : ServerCodec {
      GradientFormat GradientFor(const Decoded&) const override {
        GradientFormat f;
        f.options.scheme = Scheme::kFloat16;
        return f;
      }
    };
    return std::make_unique<Answer>();
  }
};

TEST(Method, AMethodRegisteredFromOutsideIsParsedAndMakesItsCodecs) {
  EXPECT_THROW(Method::Parse("half-cast"), Error);
  RegisterMethod({{"half-cast"},
                  [](const MethodName& name) -> std::unique_ptr<Method> {
                    if (!name.arguments.empty() || name.gradient) name.Refuse("half-cast takes no arguments");
                    return std::make_unique<HalfCast>();
                  },
                  "half-cast",
                  {{"`half-cast`", "fp16 both ways"}},
                  {}});
  EXPECT_EQ(Method::Parse("half-cast")->ToString(), "half-cast");
  EXPECT_THROW(Method::Parse("half-cast:3"), Error);
  const Exchange e = RunExchange("half-cast");
  EXPECT_EQ(e.activation_message.scheme, Scheme::kFloat16);
  EXPECT_EQ(e.gradient_message.scheme, Scheme::kFloat16);
}

// A setting belongs to one method: another method cannot declare its key.
TEST(Method, ASettingKeyOfAnotherMethodIsRefused) {
  MethodRegistration copycat{{"copycat"}, [](const MethodName&) { return Method::Parse("bf16"); }, "copycat", {},
                             {{"amaq_gate_lr", MethodSetting::Kind::kNumber, "copied", 0, 1, 0.5}}};
  try {
    RegisterMethod(copycat);
    FAIL() << "a second declaration of amaq_gate_lr must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("amaq_gate_lr"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Method::Parse("copycat"), Error) << "nothing was registered";
  EXPECT_EQ(FindMethodSetting("amaq_gate_lr")->default_number, 0.01);
}

// docs/configuration.md's table of methods is the registry's (each method's rows where it registers).
TEST(Method, TheDocsTableOfMethodsIsTheRegistrys) {
  std::ifstream in(std::string(AMAQ_SOURCE_DIR) + "/docs/configuration.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  const std::string table = MethodTable(BuiltInMethods());
  EXPECT_NE(doc.find("\n## Methods\n\n" + table + "\n"), std::string::npos)
      << "docs/configuration.md, \"## Methods\", must hold this table (from quant/methods/*.cc):\n" << table;
}

}  // namespace
}  // namespace amaq::quant
