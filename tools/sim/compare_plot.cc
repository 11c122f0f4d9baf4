// --plot: the series to CSV in a private temporary folder, then plot_compare.py on them
// (compare_plot.h). The interpreter runs with an argument vector (posix_spawn), never a
// shell, so no path is ever parsed as a command.
#include "tools/sim/compare_plot.h"

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

extern char** environ;

namespace spgate::sim {
namespace {

namespace fs = std::filesystem;

// Runs `argv` and waits; its stdout and stderr are ours. Returns its exit status.
absl::StatusOr<int> RunProcess(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--plot: cannot run the plotting interpreter ", argv[0], ": ", std::strerror(rc),
        " (set SPGATE_PLOT_PYTHON to a python3 with matplotlib: Debian's python3-matplotlib)"));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("--plot: waitpid: ", std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The folder this binary is in ("" if /proc does not say).
fs::path ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// A folder only this process uses, removed with what is in it.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create() {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string tmpl = (base / "spgate-sim-plot.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("--plot: mkdtemp in ", base.string(), ": ",
                                              std::strerror(errno)));
    }
    return TempDir(tmpl);
  }
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, fs::path())) {}
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  explicit TempDir(fs::path p) : path_(std::move(p)) {}
  fs::path path_;
};

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("--plot: cannot write ", path.string()));
  return absl::OkStatus();
}

absl::Status ExitStatus(const absl::StatusOr<int>& rc, const ComparePlotter& p,
                        const std::string& what) {
  if (!rc.ok()) return rc.status();
  if (*rc == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "--plot: %s %s %s exited with status %d (its message is above)", what, p.python,
      p.script, *rc));
}

}  // namespace

std::string CompareModesCsv(const CompareResult& r) {
  std::string out = "step,policy,group,tp_only_share\n";
  for (const PolicyResult& p : r.policies) {
    for (size_t i = 0; i < p.group_tp_share.size(); ++i) {
      const int64_t step =
          std::min<int64_t>(r.steps, static_cast<int64_t>(i + 1) * r.series_window);
      for (size_t g = 0; g < p.group_tp_share[i].size(); ++g) {
        absl::StrAppendFormat(&out, "%d,%s,%d,%.4f\n", step, p.name, g, p.group_tp_share[i][g]);
      }
    }
  }
  return out;
}

absl::StatusOr<ComparePlotter> FindComparePlotter() {
  ComparePlotter p;
  const char* python = std::getenv("SPGATE_PLOT_PYTHON");
  p.python = python != nullptr && *python != '\0' ? python : SPGATE_PLOT_PYTHON;
  std::vector<fs::path> candidates;
  if (const fs::path dir = ExecutableDir(); !dir.empty()) {
    candidates.push_back(dir / ".." / "share" / "spgate" / "plot_compare.py");
  }
  candidates.emplace_back(SPGATE_PLOT_SCRIPT_SOURCE);
  std::string tried;
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) {
      p.script = fs::weakly_canonical(c, ec).string();
      if (ec) p.script = c.string();
      return p;
    }
    absl::StrAppend(&tried, tried.empty() ? "" : ", ", c.string());
  }
  return absl::NotFoundError(absl::StrCat("--plot: plot_compare.py is in none of ", tried));
}

absl::Status CheckOutputFolder(absl::string_view flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const fs::path out(path);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, " is a folder; give a file's path"));
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": folder ", dir.string(), " does not exist"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": folder ", dir.string(), " is not writable"));
  }
  return absl::OkStatus();
}

absl::Status CheckComparePlot(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (!(ext == ".png" || ext == ".svg" || ext == ".pdf")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot=", path, ": want a .png, .svg or .pdf file"));
  }
  if (absl::Status s = CheckOutputFolder("plot", path); !s.ok()) return s;
  absl::StatusOr<ComparePlotter> p = FindComparePlotter();
  if (!p.ok()) return p.status();
  return ExitStatus(RunProcess({p->python, p->script, "--check"}), *p, "the check");
}

absl::Status WriteComparePlot(const CompareResult& r, const std::string& path) {
  absl::StatusOr<ComparePlotter> p = FindComparePlotter();
  if (!p.ok()) return p.status();
  absl::StatusOr<TempDir> tmp = TempDir::Create();
  if (!tmp.ok()) return tmp.status();
  const fs::path series = tmp->path() / "series.csv";
  const fs::path modes = tmp->path() / "modes.csv";
  if (absl::Status s = WriteText(series, CompareSeriesCsv(r)); !s.ok()) return s;
  if (absl::Status s = WriteText(modes, CompareModesCsv(r)); !s.ok()) return s;
  std::string title =
      absl::StrFormat("spgate-sim replay --compare: %s x %s",
                      CountText(r.groups, r.pipelined() ? "replica" : "group"),
                      CountText(r.steps, "step"));
  if (r.pipelined()) {
    absl::StrAppendFormat(&title, ", pp=%d vp=%d microbatches=%d %s", r.pp, r.vp,
                          r.microbatches, r.schedule);
  }
  if (r.switch_cost_s > 0) absl::StrAppendFormat(&title, ", switch cost %g s", r.switch_cost_s);
  return ExitStatus(RunProcess({p->python, p->script, "--series", series.string(), "--modes",
                                modes.string(), "--window", absl::StrCat(r.series_window),
                                "--title", title, "--out", path}),
                    *p, "drawing with");
}

}  // namespace spgate::sim
