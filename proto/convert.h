// Conversions between the wire types (spgate.v1) and the policy's domain types, shared
// by the daemon and the worker client. GateConfig on the wire is a partial config
// (every field optional); the domain GateConfig is always complete. The fields are
// matched by name with the one field table (policy/gate_config.h), so no field is
// spelled out here.
//
// Usage:
//   spgate::GateConfig effective = spgate::LayerGateConfig(spgate::GateConfig{}, file);
//   absl::Status s = spgate::ApplyFieldMask(update.config(), update.update_mask(), &overrides);
#ifndef SPGATE_PROTO_CONVERT_H_
#define SPGATE_PROTO_CONVERT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "policy/adaptive_policy.h"
#include "policy/step_plan.h"
#include "policy/types.h"
#include "spgate/v1/gate.pb.h"

namespace spgate {

// Returns `base` with every field set in `layer` replaced.
GateConfig LayerGateConfig(GateConfig base, const v1::GateConfig& layer);

// The spgate.v1.GateConfig field of a row of kGateFields (null only if the proto lacks
// it, which tests/proto/convert_test.cc refuses).
const google::protobuf::FieldDescriptor* WireGateField(const GateField& field);

// A wire GateConfig with every field set.
v1::GateConfig ToProto(const GateConfig& config);

// Applies `update` to `overrides` for the paths in `mask`: a path whose field is set in
// `update` overrides it, a path whose field is unset removes the override. An empty
// mask means every field set in `update`. Unknown paths: INVALID_ARGUMENT naming them.
absl::Status ApplyFieldMask(const v1::GateConfig& update, const google::protobuf::FieldMask& mask,
                            v1::GateConfig* overrides);

// The learned table on the wire (cells with data only) and back. Cells with a bad band,
// a bad mode or non-finite / negative sums are dropped, never trusted.
v1::LearnedTable ToProto(const ThroughputTable& table);
ThroughputTable FromProto(const v1::LearnedTable& table);

// google.protobuf.Timestamp and absl::Time, both ways. A Timestamp is read as seconds plus
// nanoseconds, so a far-future time in a state file stays far in the future instead of
// overflowing a count of nanoseconds.
google::protobuf::Timestamp ToTimestamp(absl::Time t);
absl::Time FromTimestamp(const google::protobuf::Timestamp& ts);

inline v1::Mode ToProto(Mode m) { return static_cast<v1::Mode>(m); }
inline v1::Reason ToProto(Reason r) { return static_cast<v1::Reason>(r); }
inline Reason FromProto(v1::Reason r) { return static_cast<Reason>(r); }
inline Mode FromProto(v1::Mode m) { return static_cast<Mode>(m); }
inline bool IsValidMode(v1::Mode m) {
  return m == v1::SEQUENCE_PARALLEL || m == v1::TENSOR_PARALLEL_ONLY;
}
inline bool IsValidReason(v1::Reason r) {
  return r >= v1::GATES_PASSED && r <= v1::SP_REQUIRED;
}

// A job's layout off the wire: vp and cp 0 read as 1, SCHEDULE_UNSPECIFIED as 1F1B; an
// unknown schedule is INVALID_ARGUMENT (the layout's ranges are ValidateJobLayout's).
absl::StatusOr<JobLayout> FromProto(const v1::JobLayout& layout);
void ToProto(const JobLayout& layout, v1::JobLayout* out);
inline StageCoordinates FromProto(const v1::StageCoordinates& c) {
  return {.dp_index = c.dp_index(), .stage = c.stage(), .cp_rank = c.cp_rank()};
}
inline void ToProto(const StageCoordinates& c, v1::StageCoordinates* out) {
  out->set_dp_index(c.dp_index);
  out->set_stage(c.stage);
  out->set_cp_rank(c.cp_rank);
}

}  // namespace spgate

#endif  // SPGATE_PROTO_CONVERT_H_
