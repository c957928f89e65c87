// amaq-study: one run of the accuracy-against-bytes study (docs/study.md), in one process: a
// SplitClient and a SplitServer meet through LocalTransport, which counts the bytes of the gRPC
// messages the network path would send, so a run costs compute and no TLS. scripts/study runs the
// grid (methods x budgets x seeds x tasks) through it, in parallel and resumably.
//
// Settings: every amaq-client key (docs/configuration.md; base_weights sets both parts'; compute_dtype
// defaults to fp32 here, not auto, so that a grid's numerics do not depend on the CPU) plus the
// study's own:
//   eval_split  tune | report   tune: the data set's validation split (to choose settings on);
//                               report: the held-out split the study reports (never tuned on)
//   out         the run's result, one JSON object (written atomically at the end)
//   channels    per-channel cut statistics and, for AMAQ, final widths (0 otherwise), CSV
//   server_compute_dtype   auto | fp32 | bf16: the server part's (default fp32; compute_dtype is the client part's)
//   curve       the run's per-step CSV (the client's own format)
// The result names its build: the commit and whether the tree was dirty when it was built, the
// LibTorch version, the compiler and the CPU (scripts/study refuses to pair runs of two commits).
// Splits: WordNet topics report on the test split; verb past tense holds out 30% of the regular
// verbs' training split (by a hash of the verb) as its report split; both tune on validation.
#include <nlohmann/json.hpp>

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "client/client_config.h"
#include "inproc/local_transport.h"
#include "client/split_client.h"
#include "common/base/atomic_file.h"
#include "common/base/config.h"
#include "common/text/datasets.h"
#include "common/base/error.h"
#include "common/base/program.h"
#include "common/model/threads.h"
#include "quant/method.h"
#include "server/split_server.h"

using namespace amaq;

namespace {

std::string Compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

// The first "model name" of /proc/cpuinfo ("unknown" where there is none) and the widest vector
// instructions its flags name (AVX-512 or AVX2): machines that share a name may not share the
// kernels their products run on, nor the kernels' rounding.
std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string model = "unknown", flags;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("model name", 0) == 0 && model == "unknown") model = line.substr(colon + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line.substr(colon + 1) + " ";
  }
  const std::string isa = flags.find(" avx512f ") != std::string::npos ? "AVX-512"
                          : flags.find(" avx2 ") != std::string::npos  ? "AVX2"
                                                                        : "no AVX2";
  return model + " (" + isa + ")";
}

Config StudyConfig() {
  Config c = client::ClientConfig("amaq-study");
  // The instrument computes in fp32 on every machine unless a grid names bf16: compute_dtype auto
  // would make a grid resumed on a CPU without bf16 arithmetic mix dtypes within one build.
  c.SetDefault("compute_dtype", "fp32");
  c.AddString("eval_split", "report", "which split the final metric is measured on", {"tune", "report"});
  c.AddString("out", "", "where the run's JSON result goes (required)");
  c.AddString("channels", "", "per-channel cut statistics (and AMAQ's widths; 0 for other methods) as CSV (empty: none)");
  c.AddString("server_compute_dtype", "fp32", "dtype of the server layers' activations (compute_dtype: the client's)",
              {"auto", "fp32", "bf16"});
  return c;
}

// The task's splits as the study uses them: train, and the evaluation split asked for.
Dataset StudyData(const Config& c) {
  const std::string task = c.String("task");
  Require(task == "wordnet" || task == "verbs", ErrorCode::kInvalidArgument,
          "amaq-study runs the tasks wordnet and verbs, not '" + task + "'");
  Dataset d = task == "wordnet" ? LoadWordNetTopics(c.String("data")) : LoadVerbPastTense(c.String("data"));
  std::vector<Example> report = d.test;
  if (task == "verbs") {
    // The loader's test split is the 363 irregular verbs: too few for a +-2 point interval, and a
    // different task. The report split is 30% of the regular verbs, held out of training.
    std::vector<Example> train;
    report.clear();
    for (Example& e : d.train) (SplitOf("study/" + e.prompt, 0, 30) == 2 ? report : train).push_back(std::move(e));
    d.train = std::move(train);
  }
  if (c.String("eval_split") == "report") d.validation = std::move(report);
  d.test.clear();
  const auto cap = static_cast<size_t>(c.Int("max_train_examples"));
  if (cap > 0 && d.train.size() > cap) d.train.resize(cap);
  return d;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return end > begin ? s / static_cast<double>(end - begin) : 0;
}

void WriteChannels(const std::string& path, const std::vector<uint8_t>& bits,
                   const std::vector<client::ChannelStatistics>& stats) {
  std::string text = "channel,bits,min,max,range,mean,stddev,kurtosis,mean_abs_gradient\n";
  char line[256];
  for (size_t i = 0; i < stats.size(); ++i) {
    const auto& s = stats[i];
    std::snprintf(line, sizeof line, "%zu,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", i, i < bits.size() ? bits[i] : 0,
                  s.min, s.max, s.max - s.min, s.mean, s.stddev, s.kurtosis, s.mean_abs_gradient);
    text += line;
  }
  WriteFileAtomically(path, text);
}

int Run(const Config& c) {
  Require(!c.String("out").empty(), ErrorCode::kInvalidArgument, "amaq-study needs --out FILE for the run's result");
  SetComputeThreads(static_cast<int>(c.Int("threads")));
  const auto started = std::chrono::steady_clock::now();
  client::ClientOptions o = client::ClientOptionsFrom(c);
  o.progress = false;
  o.checkpoint_dir.clear();
  o.csv_path = c.String("csv");
  server::ServerOptions s;
  s.model_dir = o.model_dir;
  s.cut_layer = o.cut_layer;
  s.device = "cpu";
  s.base_weights = o.base_weights;
  s.compute_dtype = c.String("server_compute_dtype");
  s.lora = o.lora;
  s.lr = o.lr;
  s.max_grad_norm = o.max_grad_norm;
  s.seed = o.seed;
  const Dataset data = StudyData(c);
  const int64_t eval_examples = std::min<int64_t>(o.eval_examples, static_cast<int64_t>(data.validation.size()));
  server::SplitServer server(s);
  inproc::LocalTransport transport(server);
  client::SplitClient client(o, data, transport);
  client::CutStatistics cut;
  if (!c.String("channels").empty()) client.ObserveCut(&cut);
  const double metric = client.Run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // records(): one per training step, then the final evaluation's (its counters include it).
  const auto& r = client.records();
  const size_t steps = r.size() - 1;
  std::vector<double> bits, loss;
  for (size_t i = 0; i < steps; ++i) {
    bits.push_back(r[i].average_bits);
    loss.push_back(r[i].loss);
  }
  const size_t quarter = std::max<size_t>(1, steps / 4), tenth = std::max<size_t>(1, steps / 10);
  const std::unique_ptr<quant::Method> method = quant::Method::Parse(o.method);
  nlohmann::json j;
  j["task"] = c.String("task");
  j["method"] = method->ToString();
  j["seed"] = o.seed;
  j["base_weights"] = o.base_weights;
  j["compute_dtype"] = client.compute_dtype();  // as resolved for this CPU
  j["server_compute_dtype"] = server.compute_dtype();
  j["steps"] = steps;
  j["batch"] = o.batch;
  j["micro_batches"] = r[steps - 1].parts;  // parts per step (auto in one process: 1): their codec messages are counted in the bytes
  j["one_step_stale"] = o.one_step_stale;
  j["eval_split"] = c.String("eval_split");
  j["eval_examples"] = eval_examples;
  j["metric"] = metric;
  j["correct"] = static_cast<int64_t>(std::llround(metric * static_cast<double>(eval_examples)));
  j["bits_mean"] = Mean(bits, 0, steps);
  for (int q = 0; q < 4; ++q) {
    j["bits_q" + std::to_string(q + 1)] = Mean(bits, q * steps / 4, q == 3 ? steps : (q + 1) * steps / 4);
  }
  j["bits_last_quarter"] = Mean(bits, steps - quarter, steps);
  j["train_bytes_up"] = r[steps - 1].wire_up;
  j["train_bytes_down"] = r[steps - 1].wire_down;
  j["eval_bytes"] = (r[steps].wire_up + r[steps].wire_down) - (r[steps - 1].wire_up + r[steps - 1].wire_down);
  j["eval_seconds"] = client.last_evaluation_seconds();
  j["eval_tokens"] = client.evaluation_tokens();  // of the rows it sent (every evaluation's, padding included)
  j["loss_first"] = Mean(loss, 0, tenth);
  j["loss_last"] = Mean(loss, steps - tenth, steps);
  j["loss_max_second_half"] = *std::max_element(loss.begin() + static_cast<long>(steps / 2), loss.end());
  j["seconds"] = seconds;
  j["build"] = {{"commit", BuildCommit()}, {"dirty", BuildDirty()}, {"libtorch", TORCH_VERSION},
                {"compiler", Compiler()}, {"cpu", CpuModel()}};
  WriteFileAtomically(c.String("out"), j.dump(1) + "\n");
  if (!c.String("channels").empty()) WriteChannels(c.String("channels"), client.GateBits(), cut.Channels());
  std::printf("%s %s seed %llu: metric %.4f on %lld examples, %.2f bits (last quarter %.2f), %.2f MB, %.0f s\n",
              c.String("task").c_str(), o.method.c_str(), static_cast<unsigned long long>(o.seed), metric,
              static_cast<long long>(eval_examples), j["bits_mean"].get<double>(), j["bits_last_quarter"].get<double>(),
              static_cast<double>(r[steps - 1].wire_up + r[steps - 1].wire_down) / 1e6, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config = StudyConfig();
  return RunProgram(config, argc, argv, Run, client::CheckClientConfig);
}
