// Reads a live /metrics page in tests without curl: one HTTP/1.0 GET over a plain
// loopback socket, and a lookup of one sample by metric name and label fragments.
//
// Usage:
//   std::string text = spgate::testing::ScrapeMetrics(daemon->metrics_port());
//   double n = spgate::testing::MetricValue(text, "spgate_decisions_total",
//                                           {"job_id=\"j\"", "mode=\"sp\""});
#ifndef SPGATE_TESTS_TESTING_METRICS_SCRAPE_H_
#define SPGATE_TESTS_TESTING_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace spgate::testing {

// The body of GET /metrics on 127.0.0.1:port; empty when the connection fails.
inline std::string ScrapeMetrics(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string resp;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// Value of the first sample of `metric` whose label set contains every fragment in
// `labels` (e.g. "reason=\"gates_passed\""); -1 when there is none.
inline double MetricValue(const std::string& text, const std::string& metric,
                          const std::vector<std::string>& labels) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind(metric + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (!all) continue;
    return std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return -1;
}

}  // namespace spgate::testing

#endif  // SPGATE_TESTS_TESTING_METRICS_SCRAPE_H_
