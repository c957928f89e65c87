#include "quant/bits_table.h"

#include <numeric>
#include <string>

#include "common/base/error.h"

namespace amaq::quant {

BitsTable BitsTable::Uniform(int bits) {
  return BitsTable{BitsLayout::kUniform, {static_cast<uint8_t>(bits)}};
}
BitsTable BitsTable::PerChannel(std::vector<uint8_t> bits) {
  return BitsTable{BitsLayout::kPerChannel, std::move(bits)};
}
BitsTable BitsTable::PerToken(std::vector<uint8_t> bits) {
  return BitsTable{BitsLayout::kPerToken, std::move(bits)};
}

int64_t BitsTable::ExpectedEntries(BitsLayout layout, int64_t rows, int64_t cols) {
  switch (layout) {
    case BitsLayout::kUniform: return 1;
    case BitsLayout::kPerChannel: return cols;
    case BitsLayout::kPerToken: return rows;
  }
  return -1;
}

void BitsTable::Validate(int64_t rows, int64_t cols) const {
  const int64_t expected = ExpectedEntries(layout, rows, cols);
  Require(expected >= 0, ErrorCode::kInvalidArgument,
          "unknown bits layout " + std::to_string(static_cast<int>(layout)) +
              ": use uniform, per-channel or per-token");
  Require(static_cast<int64_t>(bits.size()) == expected, ErrorCode::kInvalidArgument,
          "a " + ToString(layout) + " bits table for a [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "] tensor needs " + std::to_string(expected) +
              " entries, got " + std::to_string(bits.size()));
  for (size_t i = 0; i < bits.size(); ++i) {
    Require(bits[i] >= kMinBits && bits[i] <= kMaxBits, ErrorCode::kInvalidArgument,
            "bit-width " + std::to_string(bits[i]) + " at bits-table entry " + std::to_string(i) +
                " is outside 1..8: every width must be 1..8");
  }
}

uint64_t BitsTable::TotalBits(int64_t rows, int64_t cols) const {
  const auto r = static_cast<uint64_t>(rows);
  const auto c = static_cast<uint64_t>(cols);
  switch (layout) {
    case BitsLayout::kUniform: return r * c * bits[0];
    case BitsLayout::kPerChannel: return r * std::accumulate(bits.begin(), bits.end(), uint64_t{0});
    case BitsLayout::kPerToken: return c * std::accumulate(bits.begin(), bits.end(), uint64_t{0});
  }
  return 0;
}

double BitsTable::AverageBits(int64_t rows, int64_t cols) const {
  const double elements = static_cast<double>(rows) * static_cast<double>(cols);
  return elements == 0 ? 0.0 : static_cast<double>(TotalBits(rows, cols)) / elements;
}

}  // namespace amaq::quant
