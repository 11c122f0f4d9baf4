// ADAPTIVE's learned tables on disk; see learned_store.h.
#include "server/learned_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/hardware_id.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"
#include "policy/forgetting.h"
#include "proto/convert.h"
#include "proto/text_format.h"
#include "server/identity.h"
#include "server/persistence.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::server {
namespace {

constexpr char kSuffix[] = ".textproto";

// A refused file's copies: <file>.corrupt, then <file>.corrupt.1 ... .corrupt.<N-1>.
constexpr int kMaxCorruptCopies = 100;

// Renames a refused file to the first free one of its .corrupt names, never over an
// earlier copy: each is the evidence of one refusal (the rename(2) alone would replace
// the first). Only this start-up touches the directory now, so a name free at the lstat
// is free at the rename. Says what it did: "renamed to P.corrupt.2 (...)", or "left in
// place (...)" and why.
std::string SetAsideCorrupt(const std::string& path) {
  for (int n = 0; n < kMaxCorruptCopies; ++n) {
    const std::string aside =
        n == 0 ? absl::StrCat(path, ".corrupt") : absl::StrCat(path, ".corrupt.", n);
    struct stat st {};
    if (::lstat(aside.c_str(), &st) == 0) continue;
    if (errno != ENOENT || std::rename(path.c_str(), aside.c_str()) != 0) {
      return absl::StrCat("left in place (cannot rename it to ", aside, ": ",
                          std::strerror(errno), ")");
    }
    if (n == 0) return absl::StrCat("renamed to ", aside);
    return absl::StrCat("renamed to ", aside, " (", path, ".corrupt",
                        n == 1 ? ", from an earlier refusal, is kept)"
                               : absl::StrCat(" through .corrupt.", n - 1,
                                              ", from earlier refusals, are kept)"));
  }
  return absl::StrCat("left in place (", path, ".corrupt through .corrupt.",
                      kMaxCorruptCopies - 1, " are taken: remove the ones you have looked at)");
}

uint64_t Fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The checksum of `m` as if its checksum field were unset (deterministic serialization:
// the same message gives the same bytes).
uint64_t ChecksumOf(v1::PersistedLearned m) {
  m.clear_checksum();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return Fnv1a64(bytes);
}

// Every double field of `m` (and of its message fields, one level down: a prior's
// hardware) finite, and non-negative unless listed in `signed_fields`. Reflection, so a
// field added to the wire table is checked without a change here.
absl::Status CheckDoubles(const google::protobuf::Message& m, const std::string& path,
                          std::initializer_list<const char*> signed_fields = {}) {
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    const std::string name = absl::StrCat(path, ".", f->name());
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (r->HasField(m, f)) {
        if (absl::Status s = CheckDoubles(r->GetMessage(m, f), name); !s.ok()) return s;
      }
      continue;
    }
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) continue;
    const double x = r->GetDouble(m, f);
    const bool may_be_negative =
        std::any_of(signed_fields.begin(), signed_fields.end(),
                    [&](const char* s) { return f->name() == s; });
    if (!std::isfinite(x) || (!may_be_negative && x < 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %g; must be finite%s", name, x, may_be_negative ? "" : " and >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTable(const v1::LearnedTable& t, const std::string& path) {
  std::set<std::pair<int, int>> seen;
  for (int i = 0; i < t.cells_size(); ++i) {
    const v1::LearnedCell& c = t.cells(i);
    const std::string at = absl::StrFormat("%s.cells[%d]", path, i);
    if (c.band() < 0 || c.band() >= kBands) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.band: %d, not in [0, %d)", at, c.band(), kBands));
    }
    if (!IsValidMode(c.mode())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.mode: %d is not SP or TP-only", at, static_cast<int>(c.mode())));
    }
    if (!seen.insert({c.band(), static_cast<int>(c.mode())}).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: band %d, mode %d appears twice", at, c.band(), static_cast<int>(c.mode())));
    }
    if (c.last_step() < 0 || (c.has_changed_step() && c.changed_step() < 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: last_step %d and changed_step %d must be >= 0", at, c.last_step(),
          c.changed_step()));
    }
    if (c.beyond() <= -kChangeConfirmSamples || c.beyond() >= kChangeConfirmSamples) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.beyond: %d, not in (-%d, %d)", at,
                                                        c.beyond(), kChangeConfirmSamples,
                                                        kChangeConfirmSamples));
    }
    if (absl::Status s = CheckDoubles(c, at, {"drift", "seconds_drift"}); !s.ok()) return s;
    if (c.seconds_drift() < kSecondsDriftMin || c.seconds_drift() > kSecondsDriftMax) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.seconds_drift: %g, not in [%g, %g]",
                                                        at, c.seconds_drift(), kSecondsDriftMin,
                                                        kSecondsDriftMax));
    }
    // Not NaN: a comparison with NaN is false.
    if (c.has_straggler_share() && !(c.straggler_share() >= 0 && c.straggler_share() <= 1)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.straggler_share: %g, not in [0, 1]",
                                                        at, c.straggler_share()));
    }
  }
  std::set<int> paired;
  for (int i = 0; i < t.pairs_size(); ++i) {
    const v1::LearnedPair& p = t.pairs(i);
    const std::string at = absl::StrFormat("%s.pairs[%d]", path, i);
    if (p.band() < 0 || p.band() >= kBands) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.band: %d, not in [0, %d)", at, p.band(), kBands));
    }
    if (!paired.insert(p.band()).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: band %d appears twice", at, p.band()));
    }
    if (p.last_step() < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.last_step: %d, must be >= 0", at, p.last_step()));
    }
    if (absl::Status s = CheckDoubles(p, at); !s.ok()) return s;
    if (p.weight() > 0 && !(p.sp_seconds() > 0 && p.tp_seconds() > 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: weight %g with sp_seconds %g and tp_seconds %g; both must be > 0 where the "
          "weight is", at, p.weight(), p.sp_seconds(), p.tp_seconds()));
    }
  }
  if (t.has_switch_cost()) {
    if (absl::Status s = CheckDoubles(t.switch_cost(), path + ".switch_cost", {"seconds"});
        !s.ok()) {
      return s;
    }
  }
  if (t.has_prior()) {
    const v1::LearnedPrior& p = t.prior();
    if (p.tp() < 0 || p.hidden() < 0 || p.layers() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".prior: tp, hidden and layers must be >= 0"));
    }
    if (absl::Status s = CheckDoubles(p, path + ".prior"); !s.ok()) return s;
  }
  // Belt and braces: the conversion drops what it does not trust; nothing may be dropped.
  const v1::LearnedTable back = ToProto(FromProto(t));
  if (back.cells_size() != t.cells_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.cells: %d of %d cells are not valid", path, t.cells_size() - back.cells_size(),
        t.cells_size()));
  }
  return absl::OkStatus();
}

absl::Status CheckRecord(const v1::PersistedLearned& m, const std::string& expected_job_id,
                         int max_stages) {
  using absl::InvalidArgumentError;
  // The version first: another version's file is refused as such, whatever its checksum.
  if (m.format_version() != kLearnedFormatVersion) {
    return InvalidArgumentError(absl::StrFormat("format_version: %d; this spgated reads %d",
                                                m.format_version(), kLearnedFormatVersion));
  }
  if (!m.has_checksum()) {
    return InvalidArgumentError("checksum: missing (a truncated file?)");
  }
  if (const uint64_t want = ChecksumOf(m); want != m.checksum()) {
    return InvalidArgumentError(absl::StrFormat(
        "checksum: %016x does not match the contents (%016x): truncated or altered",
        m.checksum(), want));
  }
  if (absl::Status s = ValidateJobId(m.job_id()); !s.ok()) return s;
  if (!expected_job_id.empty() && m.job_id() != expected_job_id) {
    return InvalidArgumentError(absl::StrFormat(
        "job_id: \"%s\", but the file is job %s's", m.job_id(), expected_job_id));
  }
  if (absl::Status s = ValidateIncarnation(m.incarnation()); !s.ok()) return s;
  if (m.bands() != kBands) {
    return InvalidArgumentError(absl::StrFormat(
        "bands: %d; this spgated's tables have %d bands", m.bands(), kBands));
  }
  if (!(std::isfinite(m.cv_band_width()) && m.cv_band_width() > 0) ||
      m.tokens_band_base() < 1) {
    return InvalidArgumentError(absl::StrFormat(
        "cv_band_width %g and tokens_band_base %d: must be > 0 and >= 1", m.cv_band_width(),
        m.tokens_band_base()));
  }
  if (!std::isfinite(m.step_seconds()) || m.step_seconds() < 0) {
    return InvalidArgumentError(
        absl::StrFormat("step_seconds: %g; must be finite and >= 0", m.step_seconds()));
  }
  if (m.fold_time().nanos() < 0 || m.fold_time().nanos() >= 1000000000) {
    return InvalidArgumentError("fold_time.nanos: not in [0, 1e9)");
  }
  if (absl::Status s = ValidateHardwareId(m.hardware_id()); !s.ok()) return s;
  if (!m.has_declared() || m.declared().tp() < 1) {
    return InvalidArgumentError("declared.tp: the group size, must be >= 1");
  }
  v1::LearnedTable declared;
  *declared.mutable_prior() = m.declared();
  if (absl::Status s = CheckTable(declared, "declared"); !s.ok()) return s;
  if (m.has_layout()) {
    absl::StatusOr<JobLayout> layout = FromProto(m.layout());
    absl::Status s = layout.ok() ? ValidateJobLayout(*layout) : layout.status();
    if (!s.ok()) return InvalidArgumentError(absl::StrCat("layout: ", s.message()));
    if (layout->pp > max_stages || m.stage_tables_size() != layout->pp) {
      return InvalidArgumentError(absl::StrFormat(
          "stage_tables: %d tables, but layout.pp is %d (at most %d)", m.stage_tables_size(),
          layout->pp, max_stages));
    }
  } else if (m.stage_tables_size() != 0) {
    return InvalidArgumentError(absl::StrFormat(
        "stage_tables: %d tables for a job without a layout", m.stage_tables_size()));
  }
  if (absl::Status s = CheckTable(m.table(), "table"); !s.ok()) return s;
  for (int i = 0; i < m.stage_tables_size(); ++i) {
    if (absl::Status s = CheckTable(m.stage_tables(i), absl::StrFormat("stage_tables[%d]", i));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

v1::LearnedPrior DeclaredToProto(const PriorInputs& in) {
  ThroughputTable t;
  t.SetPriorInputs(in);
  v1::LearnedPrior p = ToProto(t).prior();
  return p;
}

PriorInputs DeclaredFromProto(const v1::LearnedPrior& p) {
  v1::LearnedTable t;
  *t.mutable_prior() = p;
  return FromProto(t).prior_inputs();
}

v1::PersistedLearned ToProto(const LearnedRecord& r) {
  v1::PersistedLearned m;
  m.set_format_version(kLearnedFormatVersion);
  m.set_job_id(r.job_id);
  m.set_incarnation(r.incarnation);
  *m.mutable_fold_time() = ToTimestamp(r.fold_time);
  m.set_step_seconds(r.step_seconds);
  if (r.key.layout.has_value()) spgate::ToProto(*r.key.layout, m.mutable_layout());
  *m.mutable_declared() = DeclaredToProto(r.key.declared);
  m.set_hardware_id(r.key.hardware_id);
  m.set_cv_band_width(r.cv_band_width);
  m.set_tokens_band_base(r.tokens_band_base);
  m.set_bands(kBands);
  *m.mutable_table() = spgate::ToProto(r.table);
  for (const ThroughputTable& t : r.stage_tables) *m.add_stage_tables() = spgate::ToProto(t);
  m.set_checksum(ChecksumOf(m));
  return m;
}

std::string WithPath(const std::string& dir, const char* name) {
  return absl::StrCat(dir, "/", name);
}

}  // namespace

uint64_t LearnedChecksum(const v1::PersistedLearned& message) { return ChecksumOf(message); }

std::string LearnedDirPath(const std::string& state_dir) {
  return absl::StrCat(state_dir, "/", kLearnedDirName);
}

std::string LearnedFilePath(const std::string& state_dir, const std::string& job_id) {
  // Job ids are [A-Za-z0-9._-]{1,128} (ValidateJobId): a file name as they are.
  return absl::StrCat(LearnedDirPath(state_dir), "/", job_id, kSuffix);
}

int64_t MaxLearnedFileBytes(int max_stages) {
  return (1 + static_cast<int64_t>(std::max(max_stages, 0))) * kMaxLearnedTableBytes;
}

std::string SerializeLearned(const LearnedRecord& record) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(ToProto(record), &text);
  return absl::StrCat("# spgated learned tables of one job; written atomically by spgated. "
                      "Not to be edited (its checksum refuses an edit).\n",
                      text);
}

absl::StatusOr<LearnedRecord> ParseLearned(const std::string& source, const std::string& text,
                                           const std::string& expected_job_id, int max_stages) {
  auto refuse = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(source, ": ", what));
  };
  if (static_cast<int64_t>(text.size()) > MaxLearnedFileBytes(max_stages)) {
    return refuse(absl::StrFormat("%d bytes, more than the %d a job of at most %d stages needs",
                                  text.size(), MaxLearnedFileBytes(max_stages), max_stages));
  }
  v1::PersistedLearned m;
  if (absl::Status s = ParseTextFormat(text, &m); !s.ok()) return refuse(s.message());
  if (absl::Status s = CheckRecord(m, expected_job_id, max_stages); !s.ok()) {
    return refuse(s.message());
  }
  LearnedRecord r;
  r.job_id = m.job_id();
  r.incarnation = m.incarnation();
  if (m.has_layout()) r.key.layout = *FromProto(m.layout());
  r.key.declared = DeclaredFromProto(m.declared());
  r.key.hardware_id = m.hardware_id();
  r.fold_time = FromTimestamp(m.fold_time());
  r.step_seconds = m.step_seconds();
  r.cv_band_width = m.cv_band_width();
  r.tokens_band_base = m.tokens_band_base();
  r.table = FromProto(m.table());
  for (const v1::LearnedTable& t : m.stage_tables()) r.stage_tables.push_back(FromProto(t));
  return r;
}

absl::Status SaveLearned(const std::string& state_dir, const LearnedRecord& record,
                         int max_stages) {
  const std::string path = LearnedFilePath(state_dir, record.job_id);
  const std::string text = SerializeLearned(record);
  if (static_cast<int64_t>(text.size()) > MaxLearnedFileBytes(max_stages)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: not written: %d bytes, more than %d", path, text.size(),
        MaxLearnedFileBytes(max_stages)));
  }
  const std::string dir = LearnedDirPath(state_dir);
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  return WriteFileAtomically(path, text);
}

absl::Status RemoveLearned(const std::string& state_dir, const std::string& job_id) {
  const std::string path = LearnedFilePath(state_dir, job_id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

LoadedLearned LoadLearnedDir(const std::string& state_dir, int max_stages, int max_records) {
  LoadedLearned out;
  const std::string dir = LearnedDirPath(state_dir);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno != ENOENT) {
      out.problems.push_back(absl::StrCat(dir, ": cannot read (", std::strerror(errno),
                                          "); every job's learned tables start cold"));
    }
    return out;
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (const size_t tmp = name.find(absl::StrCat(kSuffix, ".tmp.")); tmp != std::string::npos) {
      RemoveStaleTempFiles(WithPath(dir, name.substr(0, tmp + sizeof(kSuffix) - 1).c_str()));
      continue;
    }
    if (!absl::EndsWith(name, kSuffix)) continue;
    const std::string path = WithPath(dir, name.c_str());
    const std::string job_id = name.substr(0, name.size() - (sizeof(kSuffix) - 1));
    absl::StatusOr<LearnedRecord> r;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      r = absl::DataLossError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
    } else {
      // Reads one byte past the bound at most: a larger file is refused by its size.
      std::string text(static_cast<size_t>(MaxLearnedFileBytes(max_stages)) + 1, '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
      r = ParseLearned(path, text, job_id, max_stages);
    }
    if (r.ok()) {
      out.records.push_back(*std::move(r));
      continue;
    }
    out.problems.push_back(absl::StrCat("refused learned tables: ", r.status().message(), "; ",
                                        SetAsideCorrupt(path), "; job ", job_id,
                                        " starts cold"));
  }
  std::sort(out.records.begin(), out.records.end(),
            [](const LearnedRecord& a, const LearnedRecord& b) {
              return a.fold_time > b.fold_time;
            });
  if (static_cast<int>(out.records.size()) > max_records) {
    for (size_t i = static_cast<size_t>(std::max(max_records, 0)); i < out.records.size(); ++i) {
      out.problems.push_back(absl::StrCat(
          LearnedFilePath(state_dir, out.records[i].job_id), ": not loaded: more than ",
          max_records, " jobs' learned tables (--max_jobs); the newest are kept"));
    }
    out.records.resize(static_cast<size_t>(std::max(max_records, 0)));
  }
  return out;
}

namespace {

// Scales a wire cell's sums to weight `w`.
void ScaleCell(v1::LearnedCell& c, double w) {
  if (c.weight() > 0) {
    const double k = w / c.weight();
    c.set_tokens(c.tokens() * k);
    c.set_seconds(c.seconds() * k);
  }
  c.set_weight(w);
}

// And a band's pairs.
void ScalePair(v1::LearnedPair& p, double w) {
  if (p.weight() > 0) {
    const double k = w / p.weight();
    p.set_sp_seconds(p.sp_seconds() * k);
    p.set_tp_seconds(p.tp_seconds() * k);
  }
  p.set_weight(w);
}

}  // namespace

ThroughputTable AgeLearned(const GateConfig& config, const ThroughputTable& table, double steps) {
  if (!(steps > 0)) return table;
  const double f = HalfLifeDecay(steps, config.adaptive_half_life_steps);
  const double floor = static_cast<double>(config.adaptive_min_samples);
  v1::LearnedTable t = spgate::ToProto(table);
  for (v1::LearnedCell& c : *t.mutable_cells()) ScaleCell(c, FlooredWeight(c.weight(), f, floor));
  for (v1::LearnedPair& p : *t.mutable_pairs()) ScalePair(p, FlooredWeight(p.weight(), f, floor));
  if (t.has_switch_cost()) {
    t.mutable_switch_cost()->set_seconds(t.switch_cost().seconds() * f);
    t.mutable_switch_cost()->set_weight(t.switch_cost().weight() * f);
  }
  return FromProto(t);
}

ThroughputTable RestampLearned(const GateConfig& config, const ThroughputTable& table,
                               int64_t step) {
  const int64_t newest = table.newest_step();
  if (newest < 0 || step < 0) return table;
  const int64_t h = config.adaptive_half_life_steps;
  const double floor = static_cast<double>(config.adaptive_min_samples);
  v1::LearnedTable t = spgate::ToProto(table);
  for (v1::LearnedCell& c : *t.mutable_cells()) {
    const double f = HalfLifeDecay(static_cast<double>(newest - c.last_step()), h);
    ScaleCell(c, FlooredWeight(c.weight(), f, floor));
    c.set_last_step(step);
    if (c.has_changed_step()) {
      const int64_t changed = c.changed_step() - newest + step;
      if (changed >= 0) {
        c.set_changed_step(changed);
      } else {
        c.clear_changed_step();
      }
    }
  }
  for (v1::LearnedPair& p : *t.mutable_pairs()) {
    const double f =
        HalfLifeDecay(static_cast<double>(std::max<int64_t>(0, newest - p.last_step())), h);
    ScalePair(p, FlooredWeight(p.weight(), f, floor));
    p.set_last_step(step);
  }
  if (t.has_switch_cost() && t.switch_cost().last_step() >= 0) {
    v1::LearnedSwitchCost& s = *t.mutable_switch_cost();
    const double f =
        HalfLifeDecay(static_cast<double>(std::max<int64_t>(0, newest - s.last_step())), h);
    s.set_seconds(s.seconds() * f);
    s.set_weight(s.weight() * f);
    s.set_last_step(step);
  }
  if (t.has_prior() && t.prior().last_step() >= 0) t.mutable_prior()->set_last_step(step);
  return FromProto(t);
}

}  // namespace spgate::server
