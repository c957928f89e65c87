// Method: how a run compresses what crosses the cut, as users name it (config key `method`):
//
//   fp32 | bf16 | fp16                          no compression (fp32) or a 16-bit cast
//   fixed:<bits>[:<granularity>[:<group>]]      fixed-bit affine, granularity tensor | channel |
//                                               token | group (default channel; group size 128)
//   amaq[:<bmax>-><bmin>]                       AMAQ, default 8->3
//   amaq:budget=<bits>[:uniform]                AMAQ allocated to a target average (docs/amaq.md);
//                                               uniform: every channel one width on the same
//                                               schedule, no learned allocation (the control)
//   <quantized method>:grad=<bits>              its gradients go back at a fixed width per channel
//   aqsgd:<bits>                                AQ-SGD with <bits>-bit deltas (gradients 8-bit)
//
// Both sides derive their codec options from it: the activation's on the client, the gradient's
// on the server (AMAQ: the activation message's own per-channel widths, with the gradient's own
// scales; fixed: the same bits and granularity; AQ-SGD: 8-bit per channel; floats: the same cast).
#pragma once

#include <optional>
#include <string>

#include "quant/bits_table.h"
#include "quant/codec.h"

namespace amaq::quant {

struct Method {
  enum class Kind { kFloat, kFixed, kAmaq, kAqsgd };
  Kind kind = Kind::kFloat;
  Scheme float_scheme = Scheme::kFloat32;  // kFloat
  int bits = 8;                            // kFixed, kAqsgd (delta bits)
  Granularity granularity = Granularity::kChannel;  // kFixed
  int group_size = 128;                    // kFixed with kGroup
  double bmax = 8, bmin = 3;               // kAmaq
  std::optional<double> budget;            // kAmaq
  bool uniform = false;                    // kAmaq with a budget
  std::optional<int> gradient_bits;        // not kFloat: fixed gradient width instead of the method's

  // Throws amaq::Error (kInvalidArgument) saying which forms are allowed.
  static Method Parse(const std::string& text);
  std::string ToString() const;

  // Codec options and widths of an activation of `cols` channels (not AMAQ: its widths are
  // learned; not AQ-SGD: its frames are made by AqsgdSender).
  EncodeOptions ActivationOptions() const;
  BitsTable ActivationBits() const;
  // Codec options and widths of the gradient that answers an activation decoded as `activation`.
  EncodeOptions GradientOptions(const Decoded& activation) const;
  BitsTable GradientBits(const Decoded& activation) const;
};

}  // namespace amaq::quant
