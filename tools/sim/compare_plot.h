// `spgate-sim replay --compare --plot=FILE.png`: the comparison's series as a figure. The
// simulator writes what Compare already computed — effective tokens/s per window for every
// policy (CompareSeriesCsv) and each group's share of TP-only decisions per window
// (CompareModesCsv) — to a private temporary folder and runs plot_compare.py on them with
// Python and matplotlib (Debian's python3-matplotlib). Nothing is drawn in C++, and a
// missing interpreter, script or matplotlib is an error that names it, checked before the
// run (CheckComparePlot) so a long replay does not end in one.
//
// The script: <binary's folder>/../share/spgate/plot_compare.py (the build tree's copy, or
// an install's), else the source tree's tools/sim/plot_compare.py. The interpreter:
// $SPGATE_PLOT_PYTHON, else the one CMake configured (the Python package's: Debian's
// /usr/bin/python3, where python3-matplotlib installs).
//
// Usage:
//   RETURN_IF_ERROR(CheckComparePlot(path));            // before Compare
//   RETURN_IF_ERROR(WriteComparePlot(result, path));   // after
#ifndef SPGATE_TOOLS_SIM_COMPARE_PLOT_H_
#define SPGATE_TOOLS_SIM_COMPARE_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tools/sim/compare.h"

namespace spgate::sim {

// step,policy,group,tp_only_share: a row per series window, policy and group (replica).
std::string CompareModesCsv(const CompareResult& result);

// The interpreter and script --plot runs; NOT_FOUND names a script that is in neither place.
struct ComparePlotter {
  std::string python;
  std::string script;
};
absl::StatusOr<ComparePlotter> FindComparePlotter();

// That `path`'s folder exists and is writable (nothing for an empty path);
// INVALID_ARGUMENT names --`flag`. Checked before a run, so a long one does not end in it.
absl::Status CheckOutputFolder(absl::string_view flag, const std::string& path);

// That `path` is a .png, .svg or .pdf in an existing folder, and that the plotter runs
// (`plot_compare.py --check`: matplotlib imports). INVALID_ARGUMENT names --plot;
// FAILED_PRECONDITION the interpreter or the missing package.
absl::Status CheckComparePlot(const std::string& path);

// Draws `result` into `path` (format from its extension).
absl::Status WriteComparePlot(const CompareResult& result, const std::string& path);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_COMPARE_PLOT_H_
