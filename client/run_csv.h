// RunCsv: a client's per-step CSV (the `csv` setting; docs/configuration.md, "The run's CSV"): one
// row per training step and per evaluation, appended and flushed as each happens. Its column
// `run` names the run a row belongs to: the UTC time (ISO 8601, milliseconds) at which that run
// took its first step; the last, `server`, the server that answered the row's step (host:port: in a
// replica set, the replica that served it; empty in process). One file holds every run written to its path: a client that continues a run
// (it starts past step 0: a restart, a resume) keeps the label of the file's last row; one that
// starts at step 0 (a new run, --fresh) gets a new label. Readers (scripts/report) tell runs apart
// by it. Not thread-safe; SplitClient owns one for its lifetime.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace amaq::client {

struct StepRecord;

class RunCsv {
 public:
  static constexpr const char* kHeader =
      "client,method,step,wire_up_bytes,wire_down_bytes,up_payload_bytes,up_metadata_bytes,down_payload_bytes,"
      "down_metadata_bytes,loss,average_bits,metric,seconds,applied,run,server";

  // Opens `path` for appending (its folder and header made where missing). Throws amaq::Error
  // (kFailedPrecondition) when it cannot be written, or when it holds rows under another header
  // (an older amaq's, without the run or server column, or another file): nothing is written then.
  explicit RunCsv(const std::string& path);

  // The run whose rows follow: a new one when `first_step` is 0, else the file's last row's (a new
  // one when the file has no row). Rows written before any call start a new run.
  void StartAt(int64_t first_step);
  // One row: `r.step` is written as steps done (step id + 1), as evaluations count.
  void Write(const std::string& client, const std::string& method, const std::string& server, const StepRecord& r);
  const std::string& run() const { return run_; }

 private:
  std::ofstream out_;
  std::string last_run_;  // the file's last row's run when opened (empty: none)
  std::string run_;       // the rows' run (empty until StartAt or the first row)
};

}  // namespace amaq::client
