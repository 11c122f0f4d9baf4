// The harnesses' main() in the normal (GCC) build, where libFuzzer is absent: runs every
// file of the corpus directories (or single files) given on the command line, then N
// deterministic mutations of them — bit flips, byte sets, truncations, splices,
// insertions and duplicated slices — so `ctest -L fuzz` keeps each harness exercised in
// a few seconds without clang. The same seed always gives the same inputs; an input that
// aborts or crashes the process is written to replay-crash-<harness> (in the working
// directory) by a signal handler, so it can join the corpus.
//
// Usage: worker_message_fuzz tests/fuzz/corpus/worker_message_fuzz [-mutations=N] [-seed=S]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr long kDefaultMutations = 200000;  // ~2-4 s per harness on a 2-core VM

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The input running now and where a crash writes it. Written from the signal handler
// with open/write only (async-signal-safe); the handler then re-raises.
const std::string* g_current = nullptr;
char g_crash_path[256] = "replay-crash";

void OnCrash(int sig) {
  if (g_current != nullptr) {
    int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t n = ::write(fd, g_current->data(), g_current->size());
      (void)n;
      ::close(fd);
    }
    static const char kMsg[] = "replay: the crashing input is in ";
    ssize_t n = ::write(2, kMsg, sizeof(kMsg) - 1);
    n = ::write(2, g_crash_path, std::strlen(g_crash_path));
    n = ::write(2, "\n", 1);
    (void)n;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void RunOne(const std::string& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current = nullptr;
}

std::string Mutate(std::string s, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1: {  // set a byte to an interesting value
        static constexpr unsigned char kValues[] = {0, 1, 0x7f, 0x80, 0xff, '0', '-', '\n', ':'};
        if (!s.empty()) s[rng() % s.size()] = static_cast<char>(kValues[rng() % sizeof(kValues)]);
        break;
      }
      case 2:  // truncate
        if (!s.empty()) s.resize(rng() % s.size());
        break;
      case 3: {  // splice: our head, another seed's tail
        const std::string& other = seeds[rng() % seeds.size()];
        const size_t cut = s.empty() ? 0 : rng() % s.size();
        const size_t from = other.empty() ? 0 : rng() % other.size();
        s = s.substr(0, cut) + other.substr(from);
        break;
      }
      case 4: {  // insert random bytes
        const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
        std::string bytes(1 + rng() % 8, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        s.insert(at, bytes);
        break;
      }
      case 5: {  // duplicate a slice
        if (s.empty()) break;
        const size_t from = rng() % s.size();
        const size_t len = 1 + rng() % (s.size() - from);
        s.insert(rng() % (s.size() + 1), s.substr(from, len));
        break;
      }
    }
  }
  if (s.size() > 4096) s.resize(4096);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = kDefaultMutations;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "-mutations=", 11) == 0) {
      mutations = std::strtol(argv[i] + 11, nullptr, 10);
    } else if (std::strncmp(argv[i], "-seed=", 6) == 0) {
      seed = std::strtoull(argv[i] + 6, nullptr, 10);
    } else if (std::filesystem::is_directory(argv[i])) {
      for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(argv[i])) {
      files.push_back(argv[i]);
    } else {
      std::fprintf(stderr, "%s: no such file or directory: %s\n", argv[0], argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> seeds;
  for (const auto& f : files) seeds.push_back(ReadAll(f));
  if (seeds.empty()) seeds.emplace_back();

  const std::string name = std::filesystem::path(argv[0]).filename().string();
  std::snprintf(g_crash_path, sizeof(g_crash_path), "replay-crash-%s", name.c_str());
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, OnCrash);
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& s : seeds) RunOne(s);
  std::mt19937_64 rng(seed);
  for (long n = 0; n < mutations; ++n) {
    const std::string input = Mutate(seeds[rng() % seeds.size()], seeds, rng);
    RunOne(input);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %zu corpus files and %ld mutations (seed %llu) in %.2f s, no findings\n",
              name.c_str(), files.size(), mutations, static_cast<unsigned long long>(seed), seconds);
  return 0;
}
