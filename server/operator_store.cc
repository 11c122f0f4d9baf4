// The operator's settings and their persistence; see operator_store.h.
#include "server/operator_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/convert.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "server/audit_log.h"
#include "server/identity.h"
#include "server/persistence.h"

namespace spgate::server {
namespace {

constexpr int64_t kMaxVersionCounter = int64_t{1} << 62;

absl::Status ValidateDuration(const google::protobuf::Duration& duration) {
  // google.protobuf.Duration's own rules: |nanos| < 1e9, and nanos of the seconds' sign.
  if (duration.nanos() <= -1'000'000'000 || duration.nanos() >= 1'000'000'000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "duration: nanos must be in (-1e9, 1e9), got ", duration.nanos()));
  }
  if ((duration.seconds() > 0 && duration.nanos() < 0) ||
      (duration.seconds() < 0 && duration.nanos() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "duration: seconds (", duration.seconds(), ") and nanos (", duration.nanos(),
        ") must have the same sign"));
  }
  const absl::Duration d =
      absl::Seconds(duration.seconds()) + absl::Nanoseconds(duration.nanos());
  if (d <= absl::ZeroDuration() || d > absl::Hours(24 * 7)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "duration: must be > 0 and at most 7 days, got ", absl::FormatDuration(d)));
  }
  return absl::OkStatus();
}

v1::FieldValue FieldValueOf(const v1::GateConfig& config,
                            const google::protobuf::FieldDescriptor* f) {
  using google::protobuf::FieldDescriptor;
  const auto* refl = v1::GateConfig::GetReflection();
  v1::FieldValue v;
  if (!refl->HasField(config, f)) return v;
  v.set_set(true);
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      v.set_value(refl->GetDouble(config, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = refl->GetEnumValue(config, f);
      v.set_value(number);
      const auto* value = f->enum_type()->FindValueByNumber(number);
      v.set_name(value != nullptr ? value->name() : absl::StrCat(number));
      break;
    }
    default:
      v.set_value(static_cast<double>(refl->GetInt64(config, f)));
  }
  return v;
}

// The overrides that differ between `before` and `after`, in field order.
void AddChanges(const v1::GateConfig& before, const v1::GateConfig& after, v1::AuditEntry* e) {
  const auto* desc = v1::GateConfig::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const v1::FieldValue old_value = FieldValueOf(before, desc->field(i));
    const v1::FieldValue new_value = FieldValueOf(after, desc->field(i));
    if (old_value.SerializeAsString() == new_value.SerializeAsString()) continue;
    v1::FieldChange* c = e->add_changes();
    c->set_field(desc->field(i)->name());
    *c->mutable_old_value() = old_value;
    *c->mutable_new_value() = new_value;
  }
}

bool IsConfigChange(const v1::AuditEntry& e) {
  return e.rpc() == "UpdateGateConfig" || e.rpc() == "RollbackGateConfig";
}

std::string ScopeName(const std::string& job_id) {
  return job_id.empty() ? "the global config" : absl::StrCat("job ", job_id, "'s config");
}

}  // namespace

GateConfig OperatorStore::GlobalEffective(const v1::GateConfig& file_layer,
                                          const v1::GateConfig& global_overrides) {
  v1::GateConfig layer = file_layer;
  layer.MergeFrom(global_overrides);
  return LayerGateConfig(GateConfig{}, layer);
}

GateConfig OperatorStore::JobEffective(const GateConfig& global, const JobScope* job) {
  return job != nullptr ? LayerGateConfig(global, job->overrides) : global;
}

int64_t OperatorStore::JobEffectiveVersion(const Layers& l, const JobScope* job) {
  return std::max(l.global_version, job != nullptr ? job->version : 0);
}

absl::Status OperatorStore::ValidateJobs(const Layers& layers, const GateConfig& global) {
  for (const auto& [id, job] : layers.jobs) {
    if (job.overrides.ByteSizeLong() == 0) continue;
    absl::Status s = ValidateGateConfig(JobEffective(global, &job));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.message(), " (effective config of job ", id, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OperatorStore::Layers> OperatorStore::FromPersisted(const v1::PersistedState& p,
                                                                   absl::Time now) {
  Layers l;
  // Every change adds one to the counter; one that no daemon could have reached (or a
  // negative one) would overflow or repeat versions, so the file is refused.
  if (p.version_counter() < 0 || p.version_counter() > kMaxVersionCounter) {
    return absl::InvalidArgumentError(absl::StrCat("version_counter ", p.version_counter(),
                                                   " out of range [0, ", kMaxVersionCounter, "]"));
  }
  l.version_counter = p.version_counter();
  l.global_overrides = p.global_overrides();
  l.global_version = p.global_version();
  l.global_update_time = p.has_global_update_time() ? FromTimestamp(p.global_update_time()) : now;
  for (const auto& j : p.jobs()) {
    RETURN_IF_ERROR(ValidateJobId(j.job_id()));
    JobScope& scope = l.jobs[j.job_id()];
    scope.overrides = j.overrides();
    scope.version = j.version();
    scope.update_time = j.has_update_time() ? FromTimestamp(j.update_time()) : now;
  }
  for (const auto& pin : p.pins()) {
    const absl::Time expire = FromTimestamp(pin.expire_time());
    if (expire <= now || !IsValidMode(pin.mode())) continue;
    RETURN_IF_ERROR(ValidateJobId(pin.job_id()));
    JobScope& scope = l.jobs[pin.job_id()];
    const PinState state{FromProto(pin.mode()), expire, pin.force()};
    if (pin.has_group()) {
      scope.group_pins[pin.group()] = state;
    } else {
      scope.pin = state;
    }
  }
  return l;
}

absl::StatusOr<std::unique_ptr<OperatorStore>> OperatorStore::Create(StoreOptions options,
                                                                     v1::GateConfig file_layer) {
  if (!options.clock) options.clock = [] { return absl::Now(); };
  std::optional<v1::PersistedState> persisted;
  if (!options.state_dir.empty()) {
    if (::mkdir(options.state_dir.c_str(), 0750) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir ", options.state_dir, ": cannot create: ", std::strerror(errno)));
    }
    // Temp files of earlier daemons killed mid-write (docs/design.md §5): never read, and
    // left where the directory is served read-only.
    if (!options.read_only) RemoveStaleTempFiles(StateFilePath(options.state_dir));
    ASSIGN_OR_RETURN(persisted, LoadPersistedState(options.state_dir));
  }
  std::unique_ptr<OperatorStore> store(new OperatorStore(std::move(options)));
  const absl::Time now = store->Now();
  Layers l;
  if (persisted.has_value()) {
    absl::StatusOr<Layers> loaded = FromPersisted(*persisted, now);
    if (!loaded.ok()) {
      return CorruptStateFile(absl::StrCat(StateFilePath(store->options_.state_dir), ": ",
                                           loaded.status().message()));
    }
    l = *std::move(loaded);
  } else {
    l.global_update_time = now;
  }
  // The audit log outlives a state file moved aside (a corrupt one, as the runbook says):
  // versions go on after its newest entry's, so one version names one API change in the
  // history and for a rollback. Only the log's tail is read (NewestAuditVersion). An
  // unreadable log leaves the state file's counter (its first append will fail, and say
  // so); a version out of the counter's range is not taken.
  if (!store->options_.state_dir.empty()) {
    if (absl::StatusOr<int64_t> newest = NewestAuditVersion(AuditLogPath(store->options_.state_dir));
        newest.ok() && *newest < kMaxVersionCounter) {
      l.version_counter = std::max(l.version_counter, *newest);
    }
  }
  // Only a changed file bumps the version (the state remembers the file last applied).
  const bool file_changed =
      persisted.has_value()
          ? persisted->file_layer().SerializeAsString() != file_layer.SerializeAsString()
          : file_layer.ByteSizeLong() > 0;
  l.file_layer = std::move(file_layer);
  l.global_effective = GlobalEffective(l.file_layer, l.global_overrides);
  if (absl::Status v = ValidateGateConfig(l.global_effective); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the --config file combined with the persisted global overrides is invalid: ",
        v.message()));
  }
  if (file_changed) {
    l.global_version = ++l.version_counter;
    l.global_update_time = now;
  }
  if (absl::Status v = ValidateJobs(l, l.global_effective); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "persisted job overrides are invalid under the current --config: ", v.message()));
  }
  // The bump is written before the daemon serves, as a SIGHUP reload's is: kept only in
  // memory, a kill -9 would leave the old file and counter behind, and the next start
  // would give the next file the same version, so one version would name two configs.
  // As for a reload, the file applies even if the write fails (counted and logged).
  if (file_changed && !store->options_.state_dir.empty() && !store->options_.read_only) {
    if (absl::Status s = SavePersistedState(store->options_.state_dir, store->Snapshot(l));
        !s.ok()) {
      (void)store->PersistFailed(absl::StrCat(
          "the changed --config applies, but its version could not be written to ",
          StateFilePath(store->options_.state_dir), ": ", s.message()));
    }
  }
  MutexLock lock(&store->data_mu_);
  store->layers_ = std::move(l);
  return store;
}

void OperatorStore::SetListener(OperatorListener* listener) {
  MutexLock lock(&persist_mu_);
  listener_ = listener;
}

OperatorStore::Layers OperatorStore::Copy() const {
  ReaderMutexLock lock(&data_mu_);
  return layers_;
}

v1::VersionedGateConfig OperatorStore::Versioned(const Layers& l, const std::string& job_id) const {
  v1::VersionedGateConfig out;
  auto it = job_id.empty() ? l.jobs.end() : l.jobs.find(job_id);
  const JobScope* job = it == l.jobs.end() ? nullptr : &it->second;
  if (!job_id.empty()) out.set_job_id(job_id);
  if (job_id.empty()) {
    *out.mutable_config() = ToProto(l.global_effective);
    *out.mutable_overrides() = l.global_overrides;
    *out.mutable_file_config() = l.file_layer;
    out.set_version(l.global_version);
    out.set_effective_version(l.global_version);
    *out.mutable_update_time() = ToTimestamp(l.global_update_time);
    return out;
  }
  const int64_t version = job != nullptr ? job->version : 0;
  *out.mutable_config() = ToProto(JobEffective(l.global_effective, job));
  if (job != nullptr) *out.mutable_overrides() = job->overrides;
  out.set_version(version);
  out.set_effective_version(JobEffectiveVersion(l, job));
  *out.mutable_update_time() =
      ToTimestamp(version == 0 ? l.global_update_time : job->update_time);
  return out;
}

v1::PersistedState OperatorStore::Snapshot(const Layers& l) const {
  v1::PersistedState s;
  s.set_version_counter(l.version_counter);
  *s.mutable_global_overrides() = l.global_overrides;
  s.set_global_version(l.global_version);
  *s.mutable_file_layer() = l.file_layer;
  *s.mutable_global_update_time() = ToTimestamp(l.global_update_time);
  const absl::Time now = Now();
  for (const auto& [id, job] : l.jobs) {
    if (job.version > 0) {
      auto* j = s.add_jobs();
      j->set_job_id(id);
      *j->mutable_overrides() = job.overrides;
      j->set_version(job.version);
      *j->mutable_update_time() = ToTimestamp(job.update_time);
    }
    // A named reference: clang before 16 cannot capture a structured binding.
    const std::string& job_id = id;
    auto add_pin = [&](const PinState& p, std::optional<int> group) {
      if (p.expire <= now) return;
      auto* pin = s.add_pins();
      pin->set_job_id(job_id);
      if (group) pin->set_group(*group);
      pin->set_mode(ToProto(p.mode));
      *pin->mutable_expire_time() = ToTimestamp(p.expire);
      if (p.force) pin->set_force(true);
    };
    if (job.pin) add_pin(*job.pin, std::nullopt);
    for (const auto& [g, p] : job.group_pins) add_pin(p, g);
  }
  return s;
}

absl::Status OperatorStore::Commit(Layers next, const std::string& changed_job,
                                   v1::AuditEntry entry, const AuditContext& audit,
                                   bool notify_listener) {
  if (options_.read_only) {
    return absl::UnavailableError(absl::StrCat(
        "spgated serves --state_dir ", options_.state_dir,
        " read-only (--allow_read_only_state_dir): API changes are refused; nothing was changed"));
  }
  if (!options_.state_dir.empty()) {
    // The audit line first, then the state file; if the state cannot be written the
    // line is taken back, so the log records exactly the changes that were made.
    *entry.mutable_time() = ToTimestamp(Now());
    entry.set_principal(audit.principal);
    entry.set_version_counter(next.version_counter);
    const std::string audit_path = AuditLogPath(options_.state_dir);
    absl::StatusOr<AuditAppend> line = AuditAppend::Start(audit_path, entry);
    if (!line.ok()) {
      return PersistFailed(absl::StrCat("could not persist the change to the audit log ",
                                        audit_path, ": ", line.status().message(),
                                        "; nothing was changed"));
    }
    absl::Status s = SavePersistedState(options_.state_dir, Snapshot(next));
    if (!s.ok()) {
      const absl::Status undo = line->Undo();
      return PersistFailed(absl::StrCat(
          "could not persist the change to ", StateFilePath(options_.state_dir), ": ",
          s.message(), "; nothing was changed",
          undo.ok() ? "" : absl::StrCat(" (but ", undo.message(), ")")));
    }
  }
  {
    MutexLock lock(&data_mu_);
    layers_ = std::move(next);
  }
  if (listener_ != nullptr && notify_listener) listener_->OnOperatorChange(changed_job);
  return absl::OkStatus();
}

absl::Status OperatorStore::SetScopeOverrides(Layers& next, const std::string& job_id,
                                              v1::GateConfig overrides,
                                              v1::AuditEntry* entry) const {
  const int64_t version = next.version_counter + 1;
  const absl::Time now = Now();
  entry->set_job_id(job_id);
  if (job_id.empty()) {
    const GateConfig effective = GlobalEffective(next.file_layer, overrides);
    RETURN_IF_ERROR(ValidateGateConfig(effective));
    RETURN_IF_ERROR(ValidateJobs(next, effective));
    AddChanges(next.global_overrides, overrides, entry);
    next.global_overrides = std::move(overrides);
    next.global_version = version;
    next.global_update_time = now;
    next.global_effective = effective;
    *entry->mutable_overrides() = next.global_overrides;
  } else {
    JobScope candidate;  // only its overrides matter to the effective config
    candidate.overrides = std::move(overrides);
    RETURN_IF_ERROR(ValidateGateConfig(JobEffective(next.global_effective, &candidate)));
    JobScope& scope = next.jobs[job_id];
    AddChanges(scope.overrides, candidate.overrides, entry);
    scope.overrides = std::move(candidate.overrides);
    scope.version = version;
    scope.update_time = now;
    *entry->mutable_overrides() = scope.overrides;
  }
  next.version_counter = version;
  entry->set_version(version);
  return absl::OkStatus();
}

v1::VersionedGateConfig OperatorStore::GetGateConfig(const std::string& job_id) const {
  ReaderMutexLock lock(&data_mu_);
  return Versioned(layers_, job_id);
}

absl::Status OperatorStore::CheckScopeWritable(const Layers& next, const std::string& job_id,
                                              std::optional<int64_t> expected_version) const {
  auto it = job_id.empty() ? next.jobs.end() : next.jobs.find(job_id);
  if (!job_id.empty()) RETURN_IF_ERROR(AdmitJobScope(next, job_id));
  const int64_t scope_version =
      job_id.empty() ? next.global_version : (it == next.jobs.end() ? 0 : it->second.version);
  if (expected_version.has_value() && *expected_version != scope_version) {
    return absl::AbortedError(absl::StrFormat(
        "version conflict: expected_version %d, but %s is at version %d; read it again "
        "and retry",
        *expected_version, ScopeName(job_id), scope_version));
  }
  return absl::OkStatus();
}

absl::Status OperatorStore::AdmitJobScope(const Layers& next, const std::string& job_id) const {
  // The live state lists every job scope as a job, so its count is the one --max_jobs
  // bounds; counting scopes here as well would cap settings-only jobs apart from live
  // ones, and a restart, which restores both into one pool, could then find more jobs
  // than the flag allows. It is asked for a scope this store holds too: one left with
  // only an expired pin is no longer tracked, and setting it again adds a job.
  if (listener_ != nullptr) return listener_->AdmitJobScope(job_id);
  if (!next.jobs.contains(job_id) &&
      static_cast<int>(next.jobs.size()) >= options_.max_job_scopes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job %s: the daemon already holds settings for %d jobs (--max_jobs)", job_id,
        options_.max_job_scopes));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::VersionedGateConfig> OperatorStore::UpdateGateConfig(
    const v1::UpdateGateConfigRequest& r, const AuditContext& audit) {
  if (!r.job_id().empty()) RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  if (r.has_expected_version()) {
    RETURN_IF_ERROR(ValidateConfigVersion("expected_version", r.expected_version()));
  }
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  const bool global = r.job_id().empty();
  auto it = global ? next.jobs.end() : next.jobs.find(r.job_id());
  RETURN_IF_ERROR(CheckScopeWritable(next, r.job_id(),
                                     r.has_expected_version()
                                         ? std::optional<int64_t>(r.expected_version())
                                         : std::nullopt));
  v1::GateConfig overrides = global ? next.global_overrides
                                    : (it == next.jobs.end() ? v1::GateConfig()
                                                             : it->second.overrides);
  const v1::GateConfig before = overrides;
  RETURN_IF_ERROR(ApplyFieldMask(r.config(), r.update_mask(), &overrides));
  if (google::protobuf::util::MessageDifferencer::Equals(before, overrides)) {
    // Nothing changes (an empty mask with no fields, or the values already set): no new
    // version, no write, no audit line, nothing pushed to workers.
    return Versioned(next, r.job_id());
  }
  v1::AuditEntry entry;
  entry.set_rpc("UpdateGateConfig");
  RETURN_IF_ERROR(SetScopeOverrides(next, r.job_id(), std::move(overrides), &entry));
  v1::VersionedGateConfig result = Versioned(next, r.job_id());
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit));
  return result;
}

absl::StatusOr<v1::VersionedGateConfig> OperatorStore::RollbackGateConfig(
    const v1::RollbackGateConfigRequest& r, const AuditContext& audit) {
  if (!r.job_id().empty()) RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  RETURN_IF_ERROR(ValidateConfigVersion("to_version", r.to_version()));
  if (r.has_expected_version()) {
    RETURN_IF_ERROR(ValidateConfigVersion("expected_version", r.expected_version()));
  }
  if (r.to_version() == 0) return RollbackToStart(r, audit);
  if (options_.state_dir.empty()) {
    return absl::FailedPreconditionError(
        "rollback reads the audit log, and spgated runs without --state_dir");
  }
  MutexLock plock(&persist_mu_);
  const std::string path = AuditLogPath(options_.state_dir);
  ASSIGN_OR_RETURN(std::vector<AuditRecord> records, ReadAuditLog(path));
  const v1::AuditEntry* target = nullptr;
  for (auto rec = records.rbegin(); rec != records.rend() && target == nullptr; ++rec) {
    if (IsConfigChange(rec->entry) && rec->entry.version() == r.to_version()) {
      target = &rec->entry;
    }
  }
  if (target == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "version %d is not an audited config change in the last %d MiB of %s",
        r.to_version(), kMaxAuditReadBytes >> 20, path));
  }
  if (target->job_id() != r.job_id()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "to_version: version %d changed %s, not %s", r.to_version(),
        ScopeName(target->job_id()), ScopeName(r.job_id())));
  }
  Layers next = Copy();
  RETURN_IF_ERROR(CheckScopeWritable(next, r.job_id(),
                                     r.has_expected_version()
                                         ? std::optional<int64_t>(r.expected_version())
                                         : std::nullopt));
  v1::AuditEntry entry;
  entry.set_rpc("RollbackGateConfig");
  entry.set_rolled_back_to(r.to_version());
  RETURN_IF_ERROR(SetScopeOverrides(next, r.job_id(), target->overrides(), &entry));
  v1::VersionedGateConfig result = Versioned(next, r.job_id());
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit));
  return result;
}

// Version 0: the scope as the daemon started, with none of the API's overrides (the
// --config file and the defaults for the global scope; the global config for a job). It
// needs no audit log. A scope with no overrides is already there: like an update that
// changes nothing, no new version.
absl::StatusOr<v1::VersionedGateConfig> OperatorStore::RollbackToStart(
    const v1::RollbackGateConfigRequest& r, const AuditContext& audit) {
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  RETURN_IF_ERROR(CheckScopeWritable(next, r.job_id(),
                                     r.has_expected_version()
                                         ? std::optional<int64_t>(r.expected_version())
                                         : std::nullopt));
  auto it = r.job_id().empty() ? next.jobs.end() : next.jobs.find(r.job_id());
  const v1::GateConfig& current = r.job_id().empty() ? next.global_overrides
                                  : it == next.jobs.end() ? v1::GateConfig::default_instance()
                                                          : it->second.overrides;
  if (current.ByteSizeLong() == 0) return Versioned(next, r.job_id());
  v1::AuditEntry entry;
  entry.set_rpc("RollbackGateConfig");
  entry.set_rolled_back_to(0);
  RETURN_IF_ERROR(SetScopeOverrides(next, r.job_id(), v1::GateConfig(), &entry));
  v1::VersionedGateConfig result = Versioned(next, r.job_id());
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit));
  return result;
}

absl::StatusOr<v1::ListConfigHistoryResponse> OperatorStore::ListConfigHistory(
    const v1::ListConfigHistoryRequest& r) {
  if (!r.job_id().empty()) RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  RETURN_IF_ERROR(ValidateHistoryPageSize("page_size", r.page_size()));
  int64_t before = -1;
  if (!r.page_token().empty() &&
      (!absl::SimpleAtoi(r.page_token(), &before) || before < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: \"", r.page_token(), "\" is not a token this call returned"));
  }
  if (options_.state_dir.empty()) {
    return absl::FailedPreconditionError(
        "spgated runs without --state_dir, so there is no audit log to list");
  }
  const int page = r.page_size() == 0 ? kDefaultHistoryPageSize : r.page_size();
  std::vector<AuditRecord> records;
  {
    // Under the persist lock, so no line is being appended or taken back meanwhile.
    MutexLock plock(&persist_mu_);
    ASSIGN_OR_RETURN(records, ReadAuditLog(AuditLogPath(options_.state_dir), before));
  }
  v1::ListConfigHistoryResponse out;
  int64_t last_offset = -1;  // of the oldest entry returned
  for (auto rec = records.rbegin(); rec != records.rend(); ++rec) {
    if (!r.job_id().empty() && rec->entry.job_id() != r.job_id()) continue;
    if (out.entries_size() == page) {
      // Older entries exist: the next page ends where the oldest one returned starts.
      out.set_next_page_token(absl::StrCat(last_offset));
      return out;
    }
    last_offset = rec->offset;
    *out.add_entries() = std::move(rec->entry);
  }
  // The read was bounded: older lines may lie before the window.
  if (!records.empty() && records.front().offset > 0) {
    out.set_next_page_token(absl::StrCat(records.front().offset));
  }
  return out;
}

absl::Status OperatorStore::ReloadConfigFile(const v1::GateConfig& file_layer) {
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  const GateConfig effective = GlobalEffective(file_layer, next.global_overrides);
  if (absl::Status s = ValidateGateConfig(effective); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("with the API's global overrides on top: ", s.message()));
  }
  RETURN_IF_ERROR(ValidateJobs(next, effective));
  next.file_layer = file_layer;
  if (effective == next.global_effective) {
    // Nothing served changes; remember the file without a new version.
    MutexLock lock(&data_mu_);
    layers_.file_layer = file_layer;
    return absl::OkStatus();
  }
  next.global_effective = effective;
  next.global_version = ++next.version_counter;
  next.global_update_time = Now();
  // The file is the source of truth here, so the new config applies even if the state
  // file cannot be written; the write keeps the persisted version counter ahead of every
  // version served, and a failure is counted. A read-only state_dir is not written.
  if (!options_.state_dir.empty() && !options_.read_only) {
    if (absl::Status s = SavePersistedState(options_.state_dir, Snapshot(next)); !s.ok()) {
      (void)PersistFailed(absl::StrCat("the reloaded --config applies, but its version could "
                                       "not be written to ", StateFilePath(options_.state_dir),
                                       ": ", s.message()));
    }
  }
  {
    MutexLock lock(&data_mu_);
    layers_ = std::move(next);
  }
  if (listener_ != nullptr) listener_->OnOperatorChange("");
  return absl::OkStatus();
}

namespace {

v1::Pin PinToProto(const std::string& job_id, std::optional<int> group, const PinState& p) {
  v1::Pin pin;
  pin.set_job_id(job_id);
  if (group) pin.set_group(*group);
  pin.set_mode(ToProto(p.mode));
  *pin.mutable_expire_time() = ToTimestamp(p.expire);
  if (p.force) pin.set_force(true);
  return pin;
}

}  // namespace

// A group index, as Register checks it (the upper bound, --max_groups_per_job, is the
// live state's: a pin for a group past it is NOT_FOUND there).
absl::Status ValidatePinGroup(bool has_group, int group) {
  if (has_group && group < 0) {
    return absl::InvalidArgumentError(absl::StrCat("group: must be >= 0, got ", group));
  }
  return absl::OkStatus();
}

absl::Status OperatorStore::ValidateUnpinRequest(const v1::UnpinRequest& r) {
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  return ValidatePinGroup(r.has_group(), r.group());
}

absl::Status OperatorStore::ValidatePinRequest(const v1::PinModeRequest& r) {
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  RETURN_IF_ERROR(ValidatePinGroup(r.has_group(), r.group()));
  if (!IsValidMode(r.mode())) {
    return absl::InvalidArgumentError("mode: must be SEQUENCE_PARALLEL or TENSOR_PARALLEL_ONLY");
  }
  return ValidateDuration(r.duration());
}

absl::StatusOr<v1::Pin> OperatorStore::PinMode(const v1::PinModeRequest& r,
                                               const AuditContext& audit) {
  RETURN_IF_ERROR(ValidatePinRequest(r));
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  RETURN_IF_ERROR(AdmitJobScope(next, r.job_id()));
  const absl::Duration d =
      absl::Seconds(r.duration().seconds()) + absl::Nanoseconds(r.duration().nanos());
  const PinState state{FromProto(r.mode()), Now() + d,
                       r.force() && r.mode() == v1::TENSOR_PARALLEL_ONLY};
  JobScope& scope = next.jobs[r.job_id()];
  std::optional<int> group;
  if (r.has_group()) group = r.group();
  // The pin this one replaces, for the audit entry's old value; an expired one is gone.
  std::optional<PinState> replaced;
  if (group) {
    if (auto it = scope.group_pins.find(*group); it != scope.group_pins.end()) {
      replaced = it->second;
    }
    scope.group_pins[*group] = state;
  } else {
    replaced = scope.pin;
    scope.pin = state;
  }
  if (replaced && replaced->expire <= Now()) replaced.reset();
  const v1::Pin pin = PinToProto(r.job_id(), group, state);
  v1::AuditEntry entry;
  entry.set_rpc("PinMode");
  entry.set_job_id(r.job_id());
  if (r.has_group()) entry.set_group(r.group());
  entry.set_mode(r.mode());
  *entry.mutable_expire_time() = pin.expire_time();
  entry.set_force(state.force);
  if (replaced) *entry.mutable_replaced_pin() = PinToProto(r.job_id(), group, *replaced);
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit));
  return pin;
}

absl::StatusOr<int> OperatorStore::Unpin(const v1::UnpinRequest& r,
                                         const AuditContext& audit) {
  RETURN_IF_ERROR(ValidateUnpinRequest(r));
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  auto it = next.jobs.find(r.job_id());
  v1::AuditEntry entry;
  int removed = 0;
  if (it != next.jobs.end()) {
    const absl::Time now = Now();
    JobScope& scope = it->second;
    // Pins still in force are what the call removed: counted and named in the entry.
    auto record = [&](const PinState& p, std::optional<int> group) {
      if (p.expire <= now) return;
      ++removed;
      *entry.add_removed_pins() = PinToProto(r.job_id(), group, p);
    };
    if (!r.has_group()) {
      if (scope.pin) record(*scope.pin, std::nullopt);
      scope.pin.reset();
      for (const auto& [g, p] : scope.group_pins) record(p, g);
      scope.group_pins.clear();
    } else if (auto git = scope.group_pins.find(r.group()); git != scope.group_pins.end()) {
      record(git->second, r.group());
      scope.group_pins.erase(git);
    }
    if (scope.empty()) next.jobs.erase(it);
  }
  entry.set_rpc("Unpin");
  entry.set_job_id(r.job_id());
  if (r.has_group()) entry.set_group(r.group());
  entry.set_removed(removed);
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit));
  return removed;
}

absl::StatusOr<v1::ForgetJobResponse> OperatorStore::ForgetJob(const v1::ForgetJobRequest& r,
                                                              const AuditContext& audit) {
  RETURN_IF_ERROR(ValidateJobId(r.job_id()));
  MutexLock plock(&persist_mu_);
  Layers next = Copy();
  auto it = next.jobs.find(r.job_id());
  const bool live = listener_ != nullptr && listener_->TracksJob(r.job_id());
  if (!live && it == next.jobs.end()) {
    return absl::NotFoundError(absl::StrCat("job ", r.job_id(), " is unknown"));
  }
  v1::ForgetJobResponse out;
  out.set_had_live_state(live);
  v1::AuditEntry entry;
  entry.set_rpc("ForgetJob");
  entry.set_job_id(r.job_id());
  if (r.forget_operator_settings() && it != next.jobs.end()) {
    const absl::Time now = Now();
    const JobScope& scope = it->second;
    AddChanges(scope.overrides, v1::GateConfig(), &entry);
    int pins = scope.pin && scope.pin->expire > now ? 1 : 0;
    for (const auto& [g, p] : scope.group_pins) pins += p.expire > now ? 1 : 0;
    entry.set_removed(pins);
    entry.set_forgot_operator_settings(true);
    out.set_removed_operator_settings(true);
    next.jobs.erase(it);
  }
  // Persisted and audited first; the live state is dropped after, as for every change.
  RETURN_IF_ERROR(Commit(std::move(next), r.job_id(), std::move(entry), audit,
                         /*notify_listener=*/false));
  if (listener_ != nullptr) out.set_sessions_ended(listener_->OnJobForgotten(r.job_id()));
  return out;
}

absl::Status OperatorStore::PersistFailed(std::string what) const {
  if (options_.on_persist_failure) options_.on_persist_failure(what);
  return absl::UnavailableError(std::move(what));
}

absl::Status OperatorStore::Flush() {
  MutexLock plock(&persist_mu_);
  if (options_.state_dir.empty() || options_.read_only) return absl::OkStatus();
  const Layers current = Copy();
  absl::Status s = SavePersistedState(options_.state_dir, Snapshot(current));
  if (!s.ok()) {  // the caller reports it (the daemon at shutdown, as an error line)
    return absl::UnavailableError(absl::StrCat("could not write ",
                                               StateFilePath(options_.state_dir), ": ",
                                               s.message()));
  }
  return absl::OkStatus();
}

JobOperatorView OperatorStore::ViewForJob(const std::string& job_id) const {
  ReaderMutexLock lock(&data_mu_);
  JobOperatorView view;
  auto it = layers_.jobs.find(job_id);
  const JobScope* job = it == layers_.jobs.end() ? nullptr : &it->second;
  view.effective = JobEffective(layers_.global_effective, job);
  view.effective_version = JobEffectiveVersion(layers_, job);
  view.served = std::make_shared<const v1::VersionedGateConfig>(Versioned(layers_, job_id));
  if (job != nullptr) {
    view.pin = job->pin;
    view.group_pins = job->group_pins;
    view.has_overrides = job->version > 0;
  }
  return view;
}

GateConfig OperatorStore::GlobalEffective() const {
  ReaderMutexLock lock(&data_mu_);
  return layers_.global_effective;
}

int64_t OperatorStore::GlobalVersion() const {
  ReaderMutexLock lock(&data_mu_);
  return layers_.global_version;
}

bool OperatorStore::HasJobScope(const std::string& job_id) const {
  ReaderMutexLock lock(&data_mu_);
  return layers_.jobs.contains(job_id);
}

std::vector<std::string> OperatorStore::JobsWithOperatorState() const {
  ReaderMutexLock lock(&data_mu_);
  std::vector<std::string> out;
  for (const auto& [id, job] : layers_.jobs) {
    if (!job.empty()) out.push_back(id);
  }
  return out;
}

}  // namespace spgate::server
