// The server's live view: /api/status follows a run over gRPC, and the page draws it in a browser.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "http_get.h"
#include "network_fixture.h"
#include "server/live_view.h"
#include "server/metrics_http.h"
#include "server/prometheus_text.h"

namespace amaq {
namespace {

using testing::GetMetrics;
using testing::Network;

constexpr char kMetricsToken[] = "live-view-token-0123456789";

class LiveView : public Network {
 protected:
  // A server and its live view behind kMetricsToken (and the clients' own tokens, as amaq-server
  // serves it).
  void StartView() {
    StartServer();
    server::MetricsOptions m;
    m.listen = "0";
    m.token = kMetricsToken;
    m.viewer_of = server::LiveViewers(*service_);
    std::map<std::string, server::HttpPage> pages = server::LiveViewPages(*service_);
    pages["/metrics"] = {"text/plain", [this](const server::Viewer&) { return server::PrometheusText(*service_); }};
    http_ = std::make_unique<server::MetricsHttp>(m, std::move(pages));
  }
  // `id`'s run of `steps` steps evaluated every 2 (`fresh`: discarding the run the server holds).
  void Train(const std::string& id, const std::string& token, int64_t steps = 4, bool fresh = false) {
    client::GrpcTransport transport(ClientTransport(token, port_));
    client::ClientOptions o = ClientFor(id, "fixed:4:channel", steps);
    o.eval_every = 2;
    o.fresh = fresh;
    client::SplitClient c(o, testing::ParityDataset(16), transport);
    c.Run();
  }
  void RunClient() {
    StartView();
    Train("client-1", testing::kToken1);
  }
  // The client ids /api/status lists to `token`, or the HTTP status when it is not 200.
  std::string ClientsShownTo(const std::string& token) {
    std::string body;
    const int code = GetMetrics(http_->port(), token, &body, "/api/status");
    if (code != 200) return "HTTP " + std::to_string(code);
    const nlohmann::json status = nlohmann::json::parse(body);
    std::string ids;
    for (const auto& c : status["clients"]) ids += (ids.empty() ? "" : ",") + c["id"].get<std::string>();
    return ids;
  }
  void TearDown() override {
    http_.reset();
    Network::TearDown();
  }
  std::unique_ptr<server::MetricsHttp> http_;
};

TEST_F(LiveView, StatusFollowsTheRun) {
  RunClient();
  std::string body;
  ASSERT_EQ(GetMetrics(http_->port(), kMetricsToken, &body, "/api/status"), 200);
  const nlohmann::json status = nlohmann::json::parse(body);
  ASSERT_EQ(status["clients"].size(), 1u);
  const nlohmann::json& c = status["clients"][0];
  EXPECT_EQ(c["id"], "client-1");
  EXPECT_EQ(c["method"], quant::Method::Parse("fixed:4:channel")->ToString());
  EXPECT_EQ(c["steps"], 4);
  EXPECT_EQ(c["curve"]["step"], nlohmann::json({1, 2, 3, 4})) << "steps done, as the evaluations count them";
  EXPECT_EQ(c["curve"]["loss"].size(), 4u);
  const std::vector<double> up = c["curve"]["mb_up"];
  EXPECT_TRUE(std::is_sorted(up.begin(), up.end()) && up.front() > 0) << "codec MB so far grow";
  EXPECT_EQ(c["width_shares"], nlohmann::json({{"4", 1.0}}));
  EXPECT_EQ(c["metric_name"], "accuracy");
  EXPECT_EQ(c["metrics"]["step"], nlohmann::json({2, 4}));
  EXPECT_GT(c["bytes_up"].get<uint64_t>(), 0u);

  EXPECT_EQ(GetMetrics(http_->port(), "", &body, "/api/status"), 401) << "the data needs the metrics token";
  ASSERT_EQ(GetMetrics(http_->port(), "", &body, "/"), 200) << "the page holds no data: it needs none";
  EXPECT_NE(body.find("<canvas id=\"loss\""), std::string::npos);
  EXPECT_EQ(body.find("http://"), std::string::npos) << "no outside assets";
  EXPECT_EQ(body.find("https://"), std::string::npos) << "no outside assets";
}

// Issue 55 item 2: a --fresh run under the same client id is shown as the current run, its curves
// alone (the old run's steps and evaluations were drawn as one line with it); the run before is
// listed apart under earlier_runs.
TEST_F(LiveView, AFreshRunIsShownApartFromTheRunBefore) {
  RunClient();
  Train("client-1", testing::kToken1, 6, /*fresh=*/true);
  std::string body;
  ASSERT_EQ(GetMetrics(http_->port(), kMetricsToken, &body, "/api/status"), 200);
  const nlohmann::json c = nlohmann::json::parse(body)["clients"][0];
  EXPECT_EQ(c["steps"], 6);
  EXPECT_EQ(c["curve"]["step"], nlohmann::json({1, 2, 3, 4, 5, 6})) << "the current run's steps alone";
  EXPECT_EQ(c["metrics"]["step"], nlohmann::json({2, 4, 6}));
  EXPECT_NE(c["run"].get<std::string>().find("method="), std::string::npos) << "the run's identity: " << c["run"];
  ASSERT_EQ(c["earlier_runs"].size(), 1u);
  const nlohmann::json& before = c["earlier_runs"][0];
  EXPECT_EQ(before["curve"]["step"], nlohmann::json({1, 2, 3, 4}));
  EXPECT_EQ(before["metrics"]["step"], nlohmann::json({2, 4}));
  EXPECT_LE(before["run_started_seconds"].get<double>(), c["run_started_seconds"].get<double>());
}

// A tenant watches its own run: a client's token gets its own row of /api/status and no other
// client's, an operator's token and the metrics token every row; /metrics stays the metrics
// token's alone.
TEST_F(LiveView, TenantsSeeTheirOwnRunOnly) {
  StartView();
  Train("client-1", testing::kToken1);
  Train("client-2", testing::kToken2);
  EXPECT_EQ(ClientsShownTo(testing::kToken1), "client-1");
  EXPECT_EQ(ClientsShownTo(testing::kToken2), "client-2");
  EXPECT_EQ(ClientsShownTo(testing::kAdminToken), "client-1,client-2");
  EXPECT_EQ(ClientsShownTo(kMetricsToken), "client-1,client-2");
  EXPECT_EQ(ClientsShownTo("not-a-token-0123456789"), "HTTP 401");
  std::string body;
  EXPECT_EQ(GetMetrics(http_->port(), testing::kToken1, &body, "/metrics"), 401) << "Prometheus text lists every client";
}

// With the server's certificate the port speaks HTTPS: pages and probes answer a client that
// verifies the certificate, plain text gets nothing; a key that is not the certificate's, or a
// missing file, stops it with a message naming the files.
TEST_F(LiveView, TheMetricsPortSpeaksHttpsWithTheServersCertificate) {
  StartServer();
  server::MetricsOptions m;
  m.listen = "0";
  m.token = kMetricsToken;
  m.tls_cert = *certs_ + "/server.pem";
  m.tls_key = *certs_ + "/server.key";
  server::MetricsHttp https(m, server::LiveViewPages(*service_));
  const std::string ca = *certs_ + "/ca.pem";
  std::string body;
  EXPECT_EQ(testing::GetMetrics(https.port(), kMetricsToken, &body, "/api/status", ca), 200);
  EXPECT_NE(body.find("\"clients\""), std::string::npos) << body;
  EXPECT_EQ(testing::GetMetrics(https.port(), "", &body, "/healthz", ca), 200);
  EXPECT_EQ(testing::GetMetrics(https.port(), "", &body, "/api/status", ca), 401);
  EXPECT_EQ(testing::GetMetrics(https.port(), kMetricsToken, &body, "/api/status"), 0) << "plain HTTP is not answered";

  // The error that stops an endpoint of `options`, or an empty text when it starts.
  const auto refusal = [](const server::MetricsOptions& options) -> std::pair<ErrorCode, std::string> {
    try {
      server::MetricsHttp started(options, {});
    } catch (const Error& e) {
      return {e.code(), e.what()};
    }
    return {ErrorCode::kInternal, ""};
  };
  server::MetricsOptions wrong_key = m;
  wrong_key.tls_key = *certs_ + "/client-1.key";
  const auto [wrong_code, wrong_text] = refusal(wrong_key);
  EXPECT_EQ(wrong_code, ErrorCode::kInvalidArgument) << "a key that is not the certificate's: " << wrong_text;
  EXPECT_NE(wrong_text.find("client-1.key"), std::string::npos) << wrong_text;
  server::MetricsOptions missing = m;
  missing.tls_cert = *certs_ + "/absent.pem";
  EXPECT_EQ(refusal(missing).first, ErrorCode::kNotFound) << "a missing certificate: " << refusal(missing).second;
}

// Headless Chromium's command line, with a profile in `dir`.
std::string Chromium(const std::string& dir) {
  return "chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --user-data-dir=" +
         dir + "/profile --window-size=1000,900 --virtual-time-budget=6000 ";
}

// The DOM of `url` after its script ran, as headless Chromium dumps it into dir/name; empty when
// Chromium could not start (`why` then says what it printed).
std::string DomOf(const std::string& url, const std::string& dir, const std::string& name, std::string* why) {
  const int dumped =
      std::system((Chromium(dir) + "--dump-dom '" + url + "' >" + dir + "/" + name + " 2>>" + dir + "/chromium.log").c_str());
  std::ifstream in(dir + "/" + name);
  std::stringstream dom;
  dom << in.rdbuf();
  if (dumped != 0 && dom.str().empty()) {
    std::ifstream log(dir + "/chromium.log");
    std::stringstream printed;
    printed << log.rdbuf();
    *why = "chromium cannot start here: " + printed.str().substr(0, 600);
  }
  return dom.str();
}

// The value of attribute `name` of the element whose opening tag begins with `tag` in `dom`.
std::string AttributeOf(const std::string& dom, const std::string& tag, const std::string& name) {
  const size_t at = dom.find(name + "=\"", dom.find(tag));
  if (at == std::string::npos) return "";
  const size_t begin = at + name.size() + 2;
  return dom.substr(begin, dom.find('"', begin) - begin);
}

// What a person sees: headless Chromium opens the page with the token in its address, the
// script polls /api/status and draws; the DOM lists the client and the screenshot is not blank.
TEST_F(LiveView, ThePageDrawsTheRunInABrowser) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup installs it): the page was not opened in a browser";
  }
  RunClient();
  const std::string dir = testing::TempDir("live-view-browser");
  const char* wanted = std::getenv("AMAQ_LIVE_VIEW_SCREENSHOT");
  const std::string screenshot = wanted ? wanted : dir + "/live-view.png";
  const std::string url = "http://127.0.0.1:" + std::to_string(http_->port()) + "/#token=" + kMetricsToken;
  const std::string chromium = Chromium(dir);
  std::string why;
  const std::string text = DomOf(url, dir, "dom.html", &why);
  if (text.empty()) GTEST_SKIP() << why;
  std::stringstream dom(text);
  EXPECT_NE(dom.str().find("data-drawn=\"1\""), std::string::npos) << dom.str().substr(0, 2000);
  EXPECT_NE(dom.str().find("<td>client-1</td>"), std::string::npos) << "the client is listed";
  EXPECT_NE(dom.str().find("<div id=\"error\"></div>"), std::string::npos) << "the token in the address was accepted";
  // Axes a person can read: whole steps, an accuracy axis within [0, 1] (the evaluations after
  // steps 2 and 4), a loss axis from 0 at the lowest.
  EXPECT_NE(dom.str().find("<canvas id=\"metric\" width=\"460\" height=\"260\" data-xticks=\"2,3,4\""), std::string::npos)
      << dom.str().substr(0, 4000);
  std::istringstream metric_ticks(AttributeOf(dom.str(), "<canvas id=\"metric\"", "data-yticks"));
  for (std::string tick; std::getline(metric_ticks, tick, ',');) {
    EXPECT_TRUE(std::stod(tick) >= 0 && std::stod(tick) <= 1) << "accuracy tick " << tick;
  }
  const std::string wrong = std::string("http://127.0.0.1:") + std::to_string(http_->port()) + "/#token=not-the-token-0123456789";
  EXPECT_NE(DomOf(wrong, dir, "wrong.html", &why).find("token refused"), std::string::npos)
      << "a wrong token is told apart from a missing one";

  ASSERT_EQ(std::system((chromium + "--screenshot=" + screenshot + " '" + url + "' >>" + dir + "/chromium.log 2>&1").c_str()), 0);
  // Not blank: the curves, bars and text give the picture many distinct colours.
  const std::string count = "/usr/bin/python3 -c \"import sys, numpy, matplotlib.image as m; p = m.imread(sys.argv[1]); "
                            "print(len(numpy.unique((p[..., :3] * 255).astype(int).reshape(-1, 3), axis=0)))\" " +
                            screenshot + " >" + dir + "/colours";
  ASSERT_EQ(std::system(count.c_str()), 0);
  int colours = 0;
  std::ifstream(dir + "/colours") >> colours;
  EXPECT_GT(colours, 20) << screenshot;
}

// Issue 55: a fresh run of 12 steps after a run of 4: the page draws the current run, lists the
// earlier one apart, and the last step label (two digits at the axis' right end) stays inside
// its canvas (it was clipped).
TEST_F(LiveView, ThePageListsEarlierRunsAndKeepsEveryStepLabel) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup installs it): the page was not opened in a browser";
  }
  RunClient();
  Train("client-1", testing::kToken1, 12, /*fresh=*/true);
  const std::string dir = testing::TempDir("live-view-runs");
  std::string why;
  const std::string dom =
      DomOf("http://127.0.0.1:" + std::to_string(http_->port()) + "/#token=" + kMetricsToken, dir, "dom.html", &why);
  if (dom.empty()) GTEST_SKIP() << why;
  for (const std::string canvas : {"loss", "bits", "metric"}) {
    const std::string tag = "<canvas id=\"" + canvas + "\"";
    const std::string ticks = AttributeOf(dom, tag, "data-xticks");
    EXPECT_EQ(ticks.substr(ticks.rfind(',') + 1).size(), 2u) << canvas << ": a two-digit last tick, " << ticks;
    const std::string right = AttributeOf(dom, tag, "data-xlabel-right");
    ASSERT_FALSE(right.empty()) << canvas << ": " << dom.substr(0, 3000);
    EXPECT_LE(std::stoi(right), std::stoi(AttributeOf(dom, tag, "width"))) << canvas << ": the last step label is clipped";
  }
  const size_t earlier = dom.find("<table id=\"earlier\"");
  ASSERT_NE(earlier, std::string::npos);
  EXPECT_EQ(dom.substr(earlier, 40).find("hidden"), std::string::npos) << "the earlier run is listed";
  EXPECT_NE(dom.find("<td>client-1</td><td>at ", earlier), std::string::npos) << dom.substr(earlier, 800);
}

}  // namespace
}  // namespace amaq
