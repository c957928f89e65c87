// The messages of one split-training step as both sides handle them, independent of how they
// travel (gRPC in deployments, a direct call in tests). proto/amaq/v1/split_training.proto carries
// exactly these fields, chunked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace amaq {

enum class StepKind { kTrain = 0, kScore = 1, kNextToken = 2 };

// The server keeps the answers to each client's last kAnswersKept applied training steps
// (docs/protocol.md, "Idempotent steps"): a client that lost up to that many replies (a retry, a
// restart from its checkpoint) gets them again exactly; one further behind would train on answers
// computed with the server's newer weights (SplitClient refuses that unless accept_divergence).
constexpr int64_t kAnswersKept = 2;

// NEXT_TOKEN steps may decode with a cache on the server (docs/protocol.md): kStart sends
// left-padded prompts and keeps the server part's keys and values, kExtend sends one new token per
// row of those sequences. kNone: every row is sent whole.
enum class DecodeCache { kNone = 0, kStart = 1, kExtend = 2 };

// What a Join does when the server holds another run of the client (docs/protocol.md, "Runs"):
// kContinue refuses it (kFailedPrecondition) and continues only the same run; kResume continues
// the stored state as this run; kFresh discards the client's stored state and starts at step 0.
enum class RunStart { kContinue = 0, kResume = 1, kFresh = 2 };

struct JoinInfo {
  std::string client_id;
  std::string fingerprint;
  int64_t cut_layer = 0;
  std::string method;
  // What defines the client's run, as "key=value" words (client/run_identity.h); empty: unchecked.
  std::string run;
  RunStart start = RunStart::kContinue;
};

// Why a stored run is not continued and how to go on, for the refusal of another run: "it differs
// in seed 1 -> 2, task wordnet -> verbs: set resume: true ... or fresh: true ..." (values
// shortened; a word only one of the runs ("key=value" words) has shows as "(none)").
std::string RunMismatch(const std::string& stored, const std::string& asked);

// What the candidates' scores of a SCORE step sum (docs/protocol.md): for each target,
// log p(token | the row up to `position`), added to the score of (the position's row, candidate).
// Positions are row * tokens + column of the step; the scores are [batch, count], row-major.
struct ScoreTargets {
  std::vector<int32_t> positions, tokens, candidates;  // one entry per target each
  int64_t count = 0;                                   // candidates per row
};
// Scoring computes the logits of at most this many target positions at a time (evaluate.h).
constexpr int64_t kHeadRowsAtOnce = 256;

struct StepInput {
  int64_t step_id = 0;
  StepKind kind = StepKind::kTrain;
  std::vector<uint64_t> sample_ids;
  int64_t batch = 0, tokens = 0;
  std::vector<int32_t> mask;          // batch * tokens
  std::vector<int32_t> labels;        // batch * tokens; none on SCORE steps
  ScoreTargets targets;               // kScore only
  std::vector<uint8_t> activation;    // codec message (or AQ-SGD frame)
  DecodeCache cache = DecodeCache::kNone;  // kNextToken only
  // A TRAIN step sent in parts (micro-batches of its rows, docs/protocol.md): part micro_batch of
  // micro_batches, its mean loss weighted by loss_scale (its share of the step's labelled tokens).
  // The server adds each part's gradients up and applies the step with its last part.
  int32_t micro_batch = 0, micro_batches = 1;
  float loss_scale = 1;
};

// The most parts a step may be sent in.
constexpr int32_t kMaxMicroBatches = 64;

struct StepResult {
  int64_t step_id = 0;
  float loss = 0;
  bool duplicate = false;             // applied before: the stored answer, not applied again
  std::vector<float> scores;          // kScore: batch x targets.count
  std::vector<int64_t> next_tokens;   // kNextToken
  std::vector<uint8_t> gradient;      // codec message (kTrain)
  double average_bits = 0;            // of the activation, as the server decoded it
  double server_seconds = 0;          // the server's compute time (decode, forward, backward, encode)
};

// SCORE steps may pack candidate segments in a row: mask values 2..kMaxCandidateSegments + 1
// (common/model/model.h), and score up to kMaxCandidateSegments candidates per row.
constexpr int32_t kMaxCandidateSegments = 1024;

// What a server accepts of one step's shape.
struct StepShapeLimits {
  int64_t max_batch_tokens = 65536;     // batch x tokens
  int64_t max_sequence_tokens = 2048;   // tokens per row: at most the model's max_position_embeddings
  int64_t vocab_size = 0;
};

// Checks what can be checked of a step without the model: a step id >= 0; batch x tokens within
// the limits; a mask of batch x tokens entries 0 or 1 (SCORE: up to kMaxCandidateSegments + 1);
// labels (none on SCORE, batch x tokens entries otherwise) -100 or a token id below vocab_size; a
// SCORE step's targets (1..kMaxCandidateSegments candidates; 1..2 x batch x (tokens + count) targets,
// each at a position that is a token, with a token id below vocab_size and a candidate below
// count), and none on other steps; a TRAIN step with a token that is not padding and a label after
// position 0 (an all-padding step would move the optimizer's state for nothing); a decoding cache
// only on NEXT_TOKEN steps, whose kStart rows end in a token (left padding) and whose kExtend rows
// are one token each. Throws amaq::Error (kInvalidArgument) naming the field.
void CheckStepFields(const StepInput& in, const StepShapeLimits& limits);

// Named tensors as plain floats (collaborative adapter averaging).
struct NamedFloat {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using NamedFloats = std::map<std::string, NamedFloat>;

// The server's half of a client's fine-tune: the LoRA of layers [cut, L) that trains with it.
struct ServerAdapterInfo {
  NamedFloats tensors;  // PEFT names without the base_model.model. prefix
  bool shared = false;  // the one LoRA of every client (shared_lora)
  int64_t lora_rank = 0;
  double lora_alpha = 0;
  std::vector<std::string> target_modules;
  int64_t applied_steps = 0;  // this client's TRAIN steps in it
};

}  // namespace amaq
