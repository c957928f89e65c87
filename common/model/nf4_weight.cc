#include "common/model/nf4_weight.h"

#include <cstring>

namespace amaq {
namespace {

template <typename T>
torch::Tensor CpuTensor(const std::vector<T>& values, torch::Dtype dtype) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(values.size())}, dtype);
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace

Nf4Weight Nf4Weight::Quantize(const torch::Tensor& weight, const quant::Nf4Options& options) {
  const torch::Tensor w = weight.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const quant::Nf4Weights q = quant::Nf4Weights::Quantize(w.data_ptr<float>(), w.numel(), options);
  Nf4Weight out;
  out.out_ = weight.size(0);
  out.in_ = weight.size(1);
  out.block_ = q.block();
  out.scale_block_ = q.scale_block();
  out.scale_mean_ = q.scale_mean();
  out.codes_ = CpuTensor(q.codes(), torch::kUInt8);
  out.scale_codes_ = CpuTensor(q.scale_codes(), torch::kInt8);
  out.scale_steps_ = CpuTensor(q.scale_steps(), torch::kFloat);
  const auto& levels = quant::Nf4Levels();
  std::vector<float> pairs;
  for (int code = 0; code < 256; ++code) {
    pairs.push_back(levels[code & 15]);
    pairs.push_back(levels[code >> 4]);
  }
  out.pair_levels_ = CpuTensor(pairs, torch::kFloat).view({256, 2});
  out.To(weight.device());
  return out;
}

torch::Tensor Nf4Weight::DenseRows(int64_t first, int64_t count, torch::Dtype dtype) const {
  if (!codes_.is_cpu() || (dtype != torch::kFloat && dtype != torch::kBFloat16)) return DenseRowsByTensorOps(first, count, dtype);
  const Nf4View view = View();
  torch::Tensor rows = torch::empty({count, in_}, torch::dtype(dtype));
  if (dtype == torch::kFloat) {
    RebuildNf4Rows(view, first * in_, count * in_, rows.data_ptr<float>());
  } else {
    RebuildNf4Rows(view, first * in_, count * in_, reinterpret_cast<uint16_t*>(rows.data_ptr<at::BFloat16>()));
  }
  return rows;
}

torch::Tensor Nf4Weight::DenseRowsByTensorOps(int64_t first, int64_t count, torch::Dtype dtype) const {
  // The blocks [b0, b1) that hold elements [e0, e1); a block may straddle two rows.
  const int64_t e0 = first * in_, e1 = (first + count) * in_;
  const int64_t b0 = e0 / block_, b1 = (e1 + block_ - 1) / block_;
  const int64_t g0 = b0 / scale_block_, g1 = (b1 - 1) / scale_block_ + 1;
  const torch::Tensor steps =
      scale_steps_.slice(0, g0, g1).repeat_interleave(scale_block_).slice(0, b0 - g0 * scale_block_, b1 - g0 * scale_block_);
  const torch::Tensor scales = (scale_codes_.slice(0, b0, b1).to(torch::kFloat) * steps + scale_mean_).clamp_min(0);
  const torch::Tensor codes = codes_.slice(0, b0 * block_ / 2, b1 * block_ / 2).to(torch::kInt);
  torch::Tensor values = pair_levels_.index_select(0, codes).view({b1 - b0, block_});
  values.mul_(scales.unsqueeze(1));
  return values.view(-1).slice(0, e0 - b0 * block_, e1 - b0 * block_).view({count, in_}).to(dtype);
}

Nf4View Nf4Weight::View() const {
  return {quant::Nf4Levels().data(), codes_.data_ptr<uint8_t>(), scale_codes_.data_ptr<int8_t>(),
          scale_steps_.data_ptr<float>(), scale_mean_, block_, scale_block_};
}

void Nf4Weight::To(const torch::Device& device) {
  for (torch::Tensor* t : {&codes_, &scale_codes_, &scale_steps_, &pair_levels_}) *t = t->to(device);
}

int64_t Nf4Weight::StoredBytes() const {
  return codes_.numel() + scale_codes_.numel() + 4 * scale_steps_.numel() + 4;
}

}  // namespace amaq
