// Wire <-> domain conversions; see convert.h.
#include "proto/convert.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace spgate {

GateConfig LayerGateConfig(GateConfig c, const v1::GateConfig& l) {
  if (l.has_max_length_cv()) c.max_length_cv = l.max_length_cv();
  if (l.has_max_rs_wait_share()) c.max_rs_wait_share = l.max_rs_wait_share();
  if (l.has_bucket_target_cv()) c.bucket_target_cv = l.bucket_target_cv();
  if (l.has_rs_wait_reenable_margin()) c.rs_wait_reenable_margin = l.rs_wait_reenable_margin();
  if (l.has_probe_interval_steps()) c.probe_interval_steps = l.probe_interval_steps();
  if (l.has_min_dwell_steps()) c.min_dwell_steps = l.min_dwell_steps();
  if (l.has_window_steps()) c.window_steps = l.window_steps();
  if (l.has_memory_headroom()) c.memory_headroom = l.memory_headroom();
  return c;
}

v1::GateConfig ToProto(const GateConfig& c) {
  v1::GateConfig p;
  p.set_max_length_cv(c.max_length_cv);
  p.set_max_rs_wait_share(c.max_rs_wait_share);
  p.set_bucket_target_cv(c.bucket_target_cv);
  p.set_rs_wait_reenable_margin(c.rs_wait_reenable_margin);
  p.set_probe_interval_steps(c.probe_interval_steps);
  p.set_min_dwell_steps(c.min_dwell_steps);
  p.set_window_steps(c.window_steps);
  p.set_memory_headroom(c.memory_headroom);
  return p;
}

double GateFieldValue(const GateConfig& c, std::string_view f) {
  if (f == "max_length_cv") return c.max_length_cv;
  if (f == "max_rs_wait_share") return c.max_rs_wait_share;
  if (f == "bucket_target_cv") return c.bucket_target_cv;
  if (f == "rs_wait_reenable_margin") return c.rs_wait_reenable_margin;
  if (f == "probe_interval_steps") return static_cast<double>(c.probe_interval_steps);
  if (f == "min_dwell_steps") return static_cast<double>(c.min_dwell_steps);
  if (f == "window_steps") return static_cast<double>(c.window_steps);
  if (f == "memory_headroom") return c.memory_headroom;
  return std::numeric_limits<double>::quiet_NaN();
}

absl::Status ApplyFieldMask(const v1::GateConfig& update, const google::protobuf::FieldMask& mask,
                            v1::GateConfig* overrides) {
  const auto* desc = v1::GateConfig::descriptor();
  const auto* refl = v1::GateConfig::GetReflection();
  v1::GateConfig result = *overrides;
  if (mask.paths_size() == 0) {
    result.MergeFrom(update);
    *overrides = std::move(result);
    return absl::OkStatus();
  }
  for (const std::string& path : mask.paths()) {
    const auto* field = desc->FindFieldByName(path);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("update_mask: unknown GateConfig field \"", path, "\""));
    }
    if (refl->HasField(update, field)) {
      if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
        refl->SetDouble(&result, field, refl->GetDouble(update, field));
      } else {
        refl->SetInt64(&result, field, refl->GetInt64(update, field));
      }
    } else {
      refl->ClearField(&result, field);
    }
  }
  *overrides = std::move(result);
  return absl::OkStatus();
}

}  // namespace spgate
