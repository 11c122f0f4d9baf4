// Config and state files; see persistence.h.
#include "server/persistence.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "google/protobuf/text_format.h"
#include "policy/gate_policy.h"
#include "proto/convert.h"
#include "proto/text_format.h"

namespace spgate::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, bool* missing = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (missing != nullptr && errno == ENOENT) {
      *missing = true;
      return std::string();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `locations`: where each field was read, for a later check's error.
template <typename Message>
absl::Status ParseText(const std::string& path, const std::string& text, Message* out,
                       google::protobuf::TextFormat::ParseInfoTree* locations = nullptr) {
  if (absl::Status s = ParseTextFormat(text, out, locations); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return absl::OkStatus();
}

// "line N: " for the first field a validation message names (each names its own field
// first; a rule between two fields names both) that the file set; empty if none.
std::string LineOfField(absl::string_view message,
                        const google::protobuf::TextFormat::ParseInfoTree* locations) {
  if (locations == nullptr) return "";
  constexpr absl::string_view kName = "abcdefghijklmnopqrstuvwxyz0123456789_";
  for (size_t at = message.find_first_of(kName); at != absl::string_view::npos;) {
    const size_t end = std::min(message.find_first_not_of(kName, at), message.size());
    const google::protobuf::FieldDescriptor* field =
        v1::GateConfig::descriptor()->FindFieldByName(std::string(message.substr(at, end - at)));
    if (field != nullptr) {
      const google::protobuf::TextFormat::ParseLocation where = locations->GetLocation(field, -1);
      if (where.line >= 0) return absl::StrCat("line ", where.line + 1, ": ");
    }
    at = message.find_first_of(kName, end);
  }
  return "";
}

absl::Status CheckLayered(const std::string& path, const std::string& what,
                          const v1::GateConfig& layer,
                          const google::protobuf::TextFormat::ParseInfoTree* locations = nullptr) {
  absl::Status s = ValidateGateConfig(LayerGateConfig(GateConfig{}, layer));
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, ": ",
                                                   LineOfField(s.message(), locations),
                                                   s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string StateFilePath(const std::string& state_dir) {
  return absl::StrCat(state_dir, "/", kStateFileName);
}

std::string LaunchesFilePath(const std::string& state_dir) {
  return absl::StrCat(state_dir, "/", kLaunchesFileName);
}

absl::StatusOr<v1::GateConfig> LoadGateConfigFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseGateConfigText(path, *text);
}

absl::StatusOr<v1::GateConfig> ParseGateConfigText(const std::string& source,
                                                   const std::string& text) {
  v1::GateConfig config;
  google::protobuf::TextFormat::ParseInfoTree locations;
  if (absl::Status s = ParseText(source, text, &config, &locations); !s.ok()) return s;
  if (absl::Status s = CheckLayered(source, "gate config", config, &locations); !s.ok()) {
    return s;
  }
  return config;
}

absl::Status CorruptStateFile(absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "corrupt state file ", what, " (fix or move the file; it is never replaced by defaults)"));
}

absl::StatusOr<std::optional<v1::PersistedState>> LoadPersistedState(const std::string& dir) {
  const std::string path = StateFilePath(dir);
  bool missing = false;
  auto text = ReadFile(path, &missing);
  if (!text.ok()) return text.status();
  if (missing) return std::optional<v1::PersistedState>();
  v1::PersistedState state;
  if (absl::Status s = ParseText(path, *text, &state); !s.ok()) {
    return CorruptStateFile(s.message());
  }
  if (absl::Status s = CheckLayered(path, "global_overrides", state.global_overrides()); !s.ok()) {
    return CorruptStateFile(s.message());
  }
  for (const auto& job : state.jobs()) {
    v1::GateConfig layered = state.global_overrides();
    layered.MergeFrom(job.overrides());
    if (job.job_id().empty()) return CorruptStateFile(absl::StrCat(path, ": a job has no job_id"));
    if (absl::Status s = CheckLayered(path, absl::StrCat("job ", job.job_id()), layered); !s.ok()) {
      return CorruptStateFile(s.message());
    }
  }
  return std::optional<v1::PersistedState>(std::move(state));
}

absl::Status SavePersistedState(const std::string& dir, const v1::PersistedState& state) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(state, &text)) {
    return absl::InternalError("cannot serialise the state");
  }
  return WriteFileAtomically(StateFilePath(dir),
                             absl::StrCat("# spgated operator state; written atomically by "
                                          "spgated. Edit only while spgated is stopped.\n",
                                          text));
}

absl::StatusOr<std::optional<v1::PersistedLaunches>> LoadPersistedLaunches(
    const std::string& dir) {
  const std::string path = LaunchesFilePath(dir);
  bool missing = false;
  auto text = ReadFile(path, &missing);
  if (!text.ok()) return text.status();
  if (missing) return std::optional<v1::PersistedLaunches>();
  v1::PersistedLaunches launches;
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("corrupt launches file ", what,
                                            " (fix or move the file; it is never replaced "
                                            "by an empty one)"));
  };
  if (absl::Status s = ParseText(path, *text, &launches); !s.ok()) return corrupt(s.message());
  for (const v1::PersistedLaunch& l : launches.launches()) {
    const bool hex_digest =
        l.credential_sha256().size() == 64 &&
        std::all_of(l.credential_sha256().begin(), l.credential_sha256().end(),
                    [](char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); });
    if (l.job_id().empty() || l.incarnation().empty() || !hex_digest) {
      return corrupt(absl::StrCat(path, ": a launch needs job_id, incarnation and a 64-digit "
                                        "credential_sha256 (job \"", l.job_id(), "\")"));
    }
  }
  return std::optional<v1::PersistedLaunches>(std::move(launches));
}

absl::Status SavePersistedLaunches(const std::string& dir, const v1::PersistedLaunches& launches) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(launches, &text)) {
    return absl::InternalError("cannot serialise the launches");
  }
  return WriteFileAtomically(LaunchesFilePath(dir),
                             absl::StrCat("# spgated job launches (credential digests, never "
                                          "credentials); written atomically by spgated.\n",
                                          text));
}

int RemoveStaleTempFiles(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string prefix =
      absl::StrCat(slash == std::string::npos ? path : path.substr(slash + 1), ".tmp.");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const absl::string_view name = e->d_name;
    if (!absl::StartsWith(name, prefix)) continue;
    int64_t pid = 0;
    if (!absl::SimpleAtoi(name.substr(prefix.size()), &pid) || pid <= 0 || pid > INT32_MAX) {
      continue;  // not a name WriteFileAtomically makes
    }
    if (pid == ::getpid()) continue;
    // kill(pid, 0) fails with ESRCH only when no such process exists.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace spgate::server
