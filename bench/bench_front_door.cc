// What the front door's HTTP/2 guard (common/net/http2_stream_guard.h) costs its one thread: the
// bytes of step uploads (a call's header block, then 1 MiB of DATA in 16 KiB frames) fed as the
// relay reads them (16 KiB at a time), and a stream of header blocks alone (each decoded by
// nghttp2's HPACK inflater: common/net/http2_header_blocks.h). Compare with what TLS costs the same
// thread (OpenSSL's AES-GCM: `openssl speed -evp aes-128-gcm`, about 1-4 GB/s a core).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "common/net/http2_stream_guard.h"
#include "http2_frames.h"

namespace amaq {
namespace {

using Clock = Http2StreamGuard::Clock;

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  return testing::Http2Frame(type, flags, stream, payload);
}

// A Steps call's header block as a gRPC client sends it (the token is 43 characters, as amaq's are).
std::string CallHeaders() {
  return testing::StepsCallHeaders("gpu-host:50051", std::string(43, 't'), "grpc-c++/1.51.1 grpc-c/29.0.0 (linux; chttp2)");
}

const std::string kPreface = testing::Http2Preface();

// Feeds `bytes` to `guard` in reads of 16 KiB at a simulated `*now`, 1 ms later each read.
void FeedAsRead(Http2StreamGuard& guard, const std::string& bytes, Clock::time_point* now) {
  for (size_t at = 0; at < bytes.size(); at += 16384) {
    *now += std::chrono::milliseconds(1);
    if (!guard.Feed(bytes.data() + at, std::min<size_t>(16384, bytes.size() - at), *now)) std::abort();
  }
}

void BM_GuardStepUploads(benchmark::State& state) {
  std::string step = Frame(0x1, 0x4, 1, CallHeaders());
  for (int i = 0; i < 64; ++i) step += Frame(0x0, 0, 1, std::string(16384, 'd'));
  for (auto _ : state) {
    Http2StreamGuard guard(1e9, 1e9);
    Clock::time_point now{};
    FeedAsRead(guard, kPreface, &now);
    for (int s = 0; s < 16; ++s) FeedAsRead(guard, step, &now);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 16 * static_cast<int64_t>(step.size()));
}
BENCHMARK(BM_GuardStepUploads)->Unit(benchmark::kMillisecond);

void BM_GuardHeaderBlocks(benchmark::State& state) {
  std::string calls;
  for (uint32_t id = 1; id < 2000; id += 2) calls += Frame(0x1, 0x4, id, CallHeaders());
  for (auto _ : state) {
    Http2StreamGuard guard(1e9, 1e9);
    Clock::time_point now{};
    FeedAsRead(guard, kPreface + calls, &now);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 1000);  // header blocks
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(calls.size()));
}
BENCHMARK(BM_GuardHeaderBlocks)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace amaq

BENCHMARK_MAIN();
