#include "quant/method.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace amaq::quant {
namespace {

TEST(Method, ParsesEveryForm) {
  EXPECT_EQ(Method::Parse("bf16").float_scheme, Scheme::kBFloat16);
  EXPECT_EQ(Method::Parse("fp32").kind, Method::Kind::kFloat);
  const Method fixed = Method::Parse("fixed:4:group:64");
  EXPECT_EQ(fixed.kind, Method::Kind::kFixed);
  EXPECT_EQ(fixed.bits, 4);
  EXPECT_EQ(fixed.granularity, Granularity::kGroup);
  EXPECT_EQ(fixed.group_size, 64);
  EXPECT_EQ(Method::Parse("fixed:3").granularity, Granularity::kChannel);
  const Method amaq = Method::Parse("amaq:6->4");
  EXPECT_EQ(amaq.bmax, 6);
  EXPECT_EQ(amaq.bmin, 4);
  EXPECT_EQ(Method::Parse("amaq").bmin, 3);
  EXPECT_EQ(*Method::Parse("amaq:budget=3.5").budget, 3.5);
  const Method control = Method::Parse("amaq:budget=3:uniform:grad=8");
  EXPECT_TRUE(control.uniform);
  EXPECT_EQ(*control.gradient_bits, 8);
  EXPECT_FALSE(Method::Parse("amaq:budget=3").uniform);
  EXPECT_EQ(Method::Parse("aqsgd:4").bits, 4);
  for (const char* text : {"bf16", "fixed:4:channel", "fixed:3:group:128", "amaq:8->3", "amaq:budget=3.5", "aqsgd:4",
                           "amaq:budget=3:uniform", "amaq:budget=4:grad=8", "fixed:3:channel:grad=8",
                           "fixed:4:group:64:grad=6", "aqsgd:4:grad=6"}) {
    EXPECT_EQ(Method::Parse(text).ToString(), text);
  }
}

TEST(Method, RefusesBadFormsWithTheAllowedOnes) {
  for (const char* text : {"", "int8", "fixed", "fixed:9", "fixed:0", "fixed:4:row", "fixed:4:channel:8",
                           "amaq:3->8", "amaq:9->3", "amaq:budget=2", "amaq:uniform", "amaq:budget=3:grad=9", "amaq:budget=3:wide", "bf16:grad=8",
                           "amaq:grad=8:uniform", "aqsgd:1", "aqsgd", "fixed:x"}) {
    try {
      Method::Parse(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << text;
    }
  }
}

TEST(Method, GradientFollowsTheActivation) {
  Decoded activation;
  activation.granularity = Granularity::kChannel;
  activation.bits = BitsTable::PerChannel({3, 8, 5});
  EXPECT_EQ(Method::Parse("amaq").GradientBits(activation), activation.bits);
  EXPECT_EQ(Method::Parse("amaq:budget=3:grad=8").GradientBits(activation), BitsTable::Uniform(8));
  EXPECT_EQ(Method::Parse("fixed:3:channel:grad=8").GradientBits(activation), BitsTable::Uniform(8));
  EXPECT_EQ(Method::Parse("fixed:3:channel:grad=8").ActivationBits(), BitsTable::Uniform(3));
  EXPECT_EQ(Method::Parse("fixed:4:token").GradientOptions(activation).granularity, Granularity::kToken);
  EXPECT_EQ(Method::Parse("aqsgd:3").GradientBits(activation), BitsTable::Uniform(8));
  EXPECT_EQ(Method::Parse("bf16").GradientOptions(activation).scheme, Scheme::kBFloat16);
}

}  // namespace
}  // namespace amaq::quant
