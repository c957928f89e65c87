// Checks classification scoring against its definition: each example's score of each label is
// the log-likelihood of the row BOS, prompt, label, EOS alone (ExampleEncoder::MakeBatch, one
// forward per label), its prompt cut at the beginning as much as the longest label's row needs
// to fit max_tokens. One row per example with every label (MakeCandidateBatch and TargetLogProbs,
// evaluate.h) must give each score to `tolerance` relative (|difference| <= tolerance x
// max(1, |score|): the two compute in differently shaped products, whose fp32 sums round apart),
// and the same chosen label for every example.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/model/batching.h"
#include "common/model/evaluate.h"
#include "common/model/model.h"

namespace amaq::testing {

inline ::testing::AssertionResult CandidatesScoreAsSeparateRows(ModelPart& model, const Tokenizer& tokenizer, int64_t bos,
                                                                int64_t eos, int64_t max_tokens,
                                                                const std::vector<Example>& examples,
                                                                const std::vector<std::string>& labels, double tolerance) {
  torch::NoGradGuard no_grad;
  const ExampleEncoder encoder(tokenizer, bos, eos, max_tokens);
  std::vector<const Example*> rows;
  for (const Example& e : examples) rows.push_back(&e);
  const CandidateBatch packed = encoder.MakeCandidateBatch(rows, labels);
  const torch::Tensor scores =
      TargetLogProbs(model->Body(packed.ids, packed.mask), [&](const torch::Tensor& x) { return model->Head(x); }, packed.targets);
  if (scores.size(0) != static_cast<int64_t>(examples.size()) || scores.size(1) != static_cast<int64_t>(labels.size())) {
    return ::testing::AssertionFailure() << "scores of shape " << scores.sizes() << " for " << examples.size() << " examples";
  }
  torch::Tensor expected = torch::zeros_like(scores);
  for (size_t e = 0; e < examples.size(); ++e) {
    std::vector<size_t> length;
    for (const std::string& label : labels) length.push_back(encoder.Encode(examples[e].prompt, label).completion.size());
    const size_t longest = *std::max_element(length.begin(), length.end());
    for (size_t k = 0; k < labels.size(); ++k) {
      // A row shorter than the longest label's by d tokens fits max_tokens - d after the same cut.
      const ExampleEncoder alone(tokenizer, bos, eos, max_tokens - static_cast<int64_t>(longest - length[k]));
      const Example row{examples[e].prompt, labels[k], examples[e].label};
      const Batch b = alone.MakeBatch({&row}, {0});
      expected[static_cast<int64_t>(e)][static_cast<int64_t>(k)] =
          SequenceLogProbs(model->LogitsAtLabels(b.ids, b.mask, b.labels), b.labels)[0][0];
    }
  }
  const torch::Tensor excess = (scores - expected).abs() - tolerance * expected.abs().clamp_min(1);
  if (excess.max().item<double>() > 0) {
    const int64_t at = excess.argmax().item<int64_t>();
    const int64_t e = at / scores.size(1), k = at % scores.size(1);
    return ::testing::AssertionFailure() << "example " << e << ", label '" << labels[static_cast<size_t>(k)]
                                         << "': " << scores[e][k].item<double>() << " against " << expected[e][k].item<double>();
  }
  const int64_t decided_apart = scores.argmax(1).ne(expected.argmax(1)).sum().item<int64_t>();
  if (decided_apart > 0) return ::testing::AssertionFailure() << decided_apart << " examples choose another label";
  return ::testing::AssertionSuccess() << "largest difference " << (scores - expected).abs().max().item<double>();
}

}  // namespace amaq::testing
