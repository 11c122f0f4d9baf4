// proto/convert: a wire GateConfig is a partial config layered over a complete domain
// GateConfig; ToProto sets every field; ApplyFieldMask applies an admin update to a
// scope's overrides (set, clear when unset in the update, merge with an empty mask,
// refuse an unknown path by name without touching the overrides); enums convert by
// cast, so their numbering and the metric labels must agree with the .proto.
#include "proto/convert.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::google::protobuf::FieldMask;
using ::google::protobuf::util::MessageDifferencer;
using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Every field different from the defaults, so a dropped field shows.
GateConfig Distinct() {
  GateConfig c;
  c.max_length_cv = 0.31;
  c.max_rs_wait_share = 0.41;
  c.bucket_target_cv = 0.12;
  c.rs_wait_reenable_margin = 0.05;
  c.probe_interval_steps = 123;
  c.min_dwell_steps = 7;
  c.window_steps = 64;
  c.memory_headroom = 0.85;
  c.policy = GatePolicyKind::kAdaptive;
  c.adaptive_cv_band_width = 0.07;
  c.adaptive_tokens_band_base = 4096;
  c.adaptive_half_life_steps = 333;
  c.adaptive_min_samples = 5;
  c.adaptive_margin = 0.04;
  c.adaptive_explore_share = 0.05;
  return c;
}

// Copies one field's value between two messages, whatever its type.
void CopyField(const v1::GateConfig& from, const google::protobuf::FieldDescriptor* field,
               v1::GateConfig* to) {
  const auto* r = from.GetReflection();
  switch (field->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(to, field, r->GetDouble(from, field));
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(to, field, r->GetInt64(from, field));
      break;
    default:
      r->SetEnumValue(to, field, r->GetEnumValue(from, field));
  }
}

// A field's wire value as a double (an enum as its number).
double WireValue(const v1::GateConfig& p, const google::protobuf::FieldDescriptor* field) {
  const auto* r = p.GetReflection();
  switch (field->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE: return r->GetDouble(p, field);
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(r->GetInt64(p, field));
    default: return r->GetEnumValue(p, field);
  }
}

FieldMask Mask(std::initializer_list<const char*> paths) {
  FieldMask m;
  for (const char* p : paths) m.add_paths(p);
  return m;
}

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The one Timestamp conversion the daemon's stores, its views, the client's wire and
// spgatectl share: nanoseconds kept, times before 1970 normalised (nanos in [0, 1e9)),
// and a Timestamp too far ahead for a count of nanoseconds staying far ahead, not wrapping
// into the past.
TEST(TimestampTest, RoundTripsNanosecondsAndFarFuture) {
  const absl::Time t = absl::FromUnixSeconds(1'700'000'000) + absl::Nanoseconds(123'456'789);
  const google::protobuf::Timestamp ts = ToTimestamp(t);
  EXPECT_EQ(ts.seconds(), 1'700'000'000);
  EXPECT_EQ(ts.nanos(), 123'456'789);
  EXPECT_EQ(FromTimestamp(ts), t);

  const absl::Time before = absl::UnixEpoch() - absl::Nanoseconds(1);
  const google::protobuf::Timestamp b = ToTimestamp(before);
  EXPECT_EQ(b.seconds(), -1);
  EXPECT_EQ(b.nanos(), 999'999'999);
  EXPECT_EQ(FromTimestamp(b), before);

  google::protobuf::Timestamp far;
  far.set_seconds(std::numeric_limits<int64_t>::max());
  far.set_nanos(999'999'999);
  EXPECT_GT(FromTimestamp(far), absl::FromCivil(absl::CivilYear(1'000'000), absl::UTCTimeZone()));
}

// The one field table (policy/gate_config.h) and the proto must list the same fields,
// in the same order, with matching types: every conversion goes by these names.
TEST(GateFieldTableTest, MatchesTheProtoInFieldOrder) {
  const auto* desc = v1::GateConfig::descriptor();
  ASSERT_EQ(desc->field_count(), static_cast<int>(kNumGateFields));
  for (int i = 0; i < desc->field_count(); ++i) {
    const GateField& row = kGateFields[static_cast<size_t>(i)];
    EXPECT_EQ(desc->field(i)->name(), row.name);
    EXPECT_EQ(desc->field(i)->number(), i + 1);
    EXPECT_TRUE(desc->field(i)->has_presence()) << row.name;  // `optional`
    EXPECT_EQ(desc->field(i)->cpp_type(),
              row.is_choice()  ? google::protobuf::FieldDescriptor::CPPTYPE_ENUM
              : row.is_count() ? google::protobuf::FieldDescriptor::CPPTYPE_INT64
                               : google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE)
        << row.name;
    EXPECT_EQ(WireGateField(row), desc->field(i)) << row.name;
  }
}

TEST(ToProtoTest, SetsEveryField) {
  const v1::GateConfig p = ToProto(Distinct());
  const auto* refl = p.GetReflection();
  for (int i = 0; i < v1::GateConfig::descriptor()->field_count(); ++i) {
    EXPECT_TRUE(refl->HasField(p, v1::GateConfig::descriptor()->field(i))) << i;
  }
  EXPECT_EQ(p.max_length_cv(), 0.31);
  EXPECT_EQ(p.max_rs_wait_share(), 0.41);
  EXPECT_EQ(p.bucket_target_cv(), 0.12);
  EXPECT_EQ(p.rs_wait_reenable_margin(), 0.05);
  EXPECT_EQ(p.probe_interval_steps(), 123);
  EXPECT_EQ(p.min_dwell_steps(), 7);
  EXPECT_EQ(p.window_steps(), 64);
  EXPECT_EQ(p.memory_headroom(), 0.85);
}

TEST(ToProtoTest, RoundTripsThroughLayering) {
  for (const GateConfig& c : {GateConfig{}, Distinct()}) {
    EXPECT_EQ(LayerGateConfig(GateConfig{}, ToProto(c)), c);
    EXPECT_EQ(LayerGateConfig(Distinct(), ToProto(c)), c);
  }
  // Through the bytes on the wire, too.
  v1::GateConfig parsed;
  ASSERT_TRUE(parsed.ParseFromString(ToProto(Distinct()).SerializeAsString()));
  EXPECT_EQ(LayerGateConfig(GateConfig{}, parsed), Distinct());
}

TEST(LayerGateConfigTest, EmptyLayerKeepsTheBase) {
  EXPECT_EQ(LayerGateConfig(Distinct(), v1::GateConfig{}), Distinct());
  EXPECT_EQ(LayerGateConfig(GateConfig{}, v1::GateConfig{}), GateConfig{});
}

TEST(LayerGateConfigTest, ReplacesOnlyTheFieldsSet) {
  v1::GateConfig layer;
  layer.set_max_length_cv(0.25);
  layer.set_window_steps(10);
  GateConfig want;
  want.max_length_cv = 0.25;
  want.window_steps = 10;
  EXPECT_EQ(LayerGateConfig(GateConfig{}, layer), want);
}

// Presence, not value, decides: a field set to 0 replaces the base (validation, not
// layering, refuses it).
TEST(LayerGateConfigTest, ExplicitZeroStillReplaces) {
  v1::GateConfig layer;
  layer.set_memory_headroom(0.0);
  layer.set_min_dwell_steps(0);
  const GateConfig got = LayerGateConfig(GateConfig{}, layer);
  EXPECT_EQ(got.memory_headroom, 0.0);
  EXPECT_EQ(got.min_dwell_steps, 0);
}

TEST(LayerGateConfigTest, EachFieldLayersIndependently) {
  const GateConfig base;
  const GateConfig top = Distinct();
  const v1::GateConfig full = ToProto(top);
  for (int i = 0; i < v1::GateConfig::descriptor()->field_count(); ++i) {
    const auto* field = v1::GateConfig::descriptor()->field(i);
    v1::GateConfig one;
    CopyField(full, field, &one);
    const GateConfig got = LayerGateConfig(base, one);
    for (const GateField& f : kGateFields) {
      const std::string_view name = f.name;
      const double want =
          name == field->name() ? GateFieldValue(top, name) : GateFieldValue(base, name);
      EXPECT_EQ(GateFieldValue(got, name), want) << "layer " << field->name() << ", " << name;
    }
  }
}

// Layers stack: defaults < file < API overrides.
TEST(LayerGateConfigTest, LayersStackInOrder) {
  v1::GateConfig file;
  file.set_max_length_cv(0.2);
  file.set_probe_interval_steps(100);
  v1::GateConfig api;
  api.set_max_length_cv(0.3);
  const GateConfig got = LayerGateConfig(LayerGateConfig(GateConfig{}, file), api);
  EXPECT_EQ(got.max_length_cv, 0.3);
  EXPECT_EQ(got.probe_interval_steps, 100);
  EXPECT_EQ(got.window_steps, GateConfig{}.window_steps);
}

TEST(GateFieldValueTest, EveryNameAndUnknown) {
  const GateConfig c = Distinct();
  const v1::GateConfig p = ToProto(c);
  for (int i = 0; i < v1::GateConfig::descriptor()->field_count(); ++i) {
    const auto* field = v1::GateConfig::descriptor()->field(i);
    const double want = WireValue(p, field);
    EXPECT_EQ(GateFieldValue(c, field->name()), want) << field->name();
  }
  EXPECT_TRUE(std::isnan(GateFieldValue(c, "max_cv")));
  EXPECT_TRUE(std::isnan(GateFieldValue(c, "")));
  EXPECT_TRUE(std::isnan(GateFieldValue(c, "MAX_LENGTH_CV")));
}

// ---- ApplyFieldMask ----

TEST(ApplyFieldMaskTest, SetsMaskedFieldsFromTheUpdate) {
  v1::GateConfig overrides;
  overrides.set_window_steps(30);
  v1::GateConfig update;
  update.set_max_length_cv(0.25);
  update.set_probe_interval_steps(50);
  update.set_memory_headroom(0.5);  // not in the mask: ignored
  ASSERT_THAT(ApplyFieldMask(update, Mask({"max_length_cv", "probe_interval_steps"}),
                             &overrides),
              IsOk());
  v1::GateConfig want;
  want.set_window_steps(30);
  want.set_max_length_cv(0.25);
  want.set_probe_interval_steps(50);
  EXPECT_TRUE(MessageDifferencer::Equals(overrides, want)) << overrides.DebugString();
}

TEST(ApplyFieldMaskTest, ReplacesAnExistingOverride) {
  v1::GateConfig overrides;
  overrides.set_max_length_cv(0.2);
  overrides.set_min_dwell_steps(5);
  v1::GateConfig update;
  update.set_max_length_cv(0.3);
  update.set_min_dwell_steps(9);
  ASSERT_THAT(ApplyFieldMask(update, Mask({"max_length_cv", "min_dwell_steps"}), &overrides),
              IsOk());
  EXPECT_EQ(overrides.max_length_cv(), 0.3);
  EXPECT_EQ(overrides.min_dwell_steps(), 9);
}

TEST(ApplyFieldMaskTest, MaskedButUnsetClearsTheOverride) {
  v1::GateConfig overrides = ToProto(Distinct());
  v1::GateConfig update;  // nothing set
  ASSERT_THAT(ApplyFieldMask(update, Mask({"max_rs_wait_share", "window_steps"}), &overrides),
              IsOk());
  EXPECT_FALSE(overrides.has_max_rs_wait_share());
  EXPECT_FALSE(overrides.has_window_steps());
  EXPECT_TRUE(overrides.has_max_length_cv());
  EXPECT_TRUE(overrides.has_memory_headroom());
  // The cleared fields are inherited again from the layer below.
  const GateConfig effective = LayerGateConfig(GateConfig{}, overrides);
  EXPECT_EQ(effective.max_rs_wait_share, GateConfig{}.max_rs_wait_share);
  EXPECT_EQ(effective.window_steps, GateConfig{}.window_steps);
  EXPECT_EQ(effective.max_length_cv, Distinct().max_length_cv);
}

TEST(ApplyFieldMaskTest, ClearingAnAbsentOverrideIsANoOp) {
  v1::GateConfig overrides;
  ASSERT_THAT(ApplyFieldMask(v1::GateConfig{}, Mask({"memory_headroom"}), &overrides), IsOk());
  EXPECT_EQ(overrides.ByteSizeLong(), 0u);
}

TEST(ApplyFieldMaskTest, EmptyMaskMergesEveryFieldSet) {
  v1::GateConfig overrides;
  overrides.set_max_length_cv(0.2);
  overrides.set_window_steps(30);
  v1::GateConfig update;
  update.set_max_length_cv(0.3);
  update.set_probe_interval_steps(77);
  ASSERT_THAT(ApplyFieldMask(update, FieldMask{}, &overrides), IsOk());
  EXPECT_EQ(overrides.max_length_cv(), 0.3);
  EXPECT_EQ(overrides.probe_interval_steps(), 77);
  EXPECT_EQ(overrides.window_steps(), 30);  // unset in the update: kept, not cleared
  EXPECT_FALSE(overrides.has_memory_headroom());
}

TEST(ApplyFieldMaskTest, EmptyMaskAndEmptyUpdateChangeNothing) {
  v1::GateConfig overrides = ToProto(Distinct());
  const v1::GateConfig before = overrides;
  ASSERT_THAT(ApplyFieldMask(v1::GateConfig{}, FieldMask{}, &overrides), IsOk());
  EXPECT_TRUE(MessageDifferencer::Equals(overrides, before));
}

TEST(ApplyFieldMaskTest, EveryFieldByMask) {
  const v1::GateConfig full = ToProto(Distinct());
  for (const GateField& f : kGateFields) {
    const std::string_view name = f.name;
    v1::GateConfig overrides;
    FieldMask mask;
    mask.add_paths(std::string(name));
    ASSERT_THAT(ApplyFieldMask(full, mask, &overrides), IsOk()) << name;
    const GateConfig got = LayerGateConfig(GateConfig{}, overrides);
    EXPECT_EQ(GateFieldValue(got, name), GateFieldValue(Distinct(), name)) << name;
    // Only that one field is set.
    std::vector<const google::protobuf::FieldDescriptor*> set;
    overrides.GetReflection()->ListFields(overrides, &set);
    ASSERT_EQ(set.size(), 1u) << name;
    EXPECT_EQ(set[0]->name(), name);
  }
}

TEST(ApplyFieldMaskTest, DuplicatePathsAreHarmless) {
  v1::GateConfig overrides;
  v1::GateConfig update;
  update.set_window_steps(12);
  ASSERT_THAT(ApplyFieldMask(update, Mask({"window_steps", "window_steps"}), &overrides),
              IsOk());
  EXPECT_EQ(overrides.window_steps(), 12);
}

TEST(ApplyFieldMaskTest, UnknownPathIsRefusedByNameAndNothingChanges) {
  const char* bad[] = {"max_cv", "", "config.max_length_cv", "maxLengthCv", "MAX_LENGTH_CV",
                       "max_length_cv.value", "job_id"};
  for (const char* path : bad) {
    v1::GateConfig overrides;
    overrides.set_window_steps(30);
    const v1::GateConfig before = overrides;
    v1::GateConfig update;
    update.set_max_length_cv(0.3);
    // A valid path before the bad one must not be half-applied.
    EXPECT_THAT(ApplyFieldMask(update, Mask({"max_length_cv", path}), &overrides),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("update_mask"),
                               HasSubstr("\"" + std::string(path) + "\""))))
        << path;
    EXPECT_TRUE(MessageDifferencer::Equals(overrides, before)) << path;
  }
}

// ---- Enums ----

TEST(EnumConversionTest, ModesMatchTheProto) {
  EXPECT_EQ(ToProto(Mode::kSequenceParallel), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(ToProto(Mode::kTensorParallelOnly), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(FromProto(v1::SEQUENCE_PARALLEL), Mode::kSequenceParallel);
  EXPECT_EQ(FromProto(v1::TENSOR_PARALLEL_ONLY), Mode::kTensorParallelOnly);
  EXPECT_FALSE(IsValidMode(v1::MODE_UNSPECIFIED));
  EXPECT_TRUE(IsValidMode(v1::SEQUENCE_PARALLEL));
  EXPECT_TRUE(IsValidMode(v1::TENSOR_PARALLEL_ONLY));
  EXPECT_FALSE(IsValidMode(static_cast<v1::Mode>(3)));
  EXPECT_FALSE(IsValidMode(static_cast<v1::Mode>(-1)));
}

// The domain Reason is a cast of the wire Reason, and its metric label is the
// lower-case proto enum name (docs/design.md §7).
TEST(EnumConversionTest, ReasonsMatchTheProtoAndTheLabels) {
  const auto* desc = v1::Reason_descriptor();
  EXPECT_EQ(desc->value_count(), kNumReasons);
  for (int i = 1; i < kNumReasons; ++i) {
    const auto r = static_cast<v1::Reason>(i);
    ASSERT_TRUE(v1::Reason_IsValid(i));
    EXPECT_TRUE(IsValidReason(r));
    EXPECT_EQ(ToProto(FromProto(r)), r);
    EXPECT_EQ(std::string(ReasonLabel(FromProto(r))), Lower(v1::Reason_Name(r)));
  }
  EXPECT_FALSE(IsValidReason(v1::REASON_UNSPECIFIED));
  EXPECT_FALSE(IsValidReason(static_cast<v1::Reason>(kNumReasons)));
  EXPECT_FALSE(IsValidReason(static_cast<v1::Reason>(-1)));
}

// The policy is the table's enum field: its domain values are the wire values and its
// names the proto names; an unknown or UNSPECIFIED wire value survives layering for
// validation to refuse by name.
TEST(EnumConversionTest, GatePolicyMatchesTheProtoAndBadValuesAreRefused) {
  EXPECT_EQ(static_cast<int>(GatePolicyKind::kStatic), v1::GateConfig::STATIC);
  EXPECT_EQ(static_cast<int>(GatePolicyKind::kAdaptive), v1::GateConfig::ADAPTIVE);
  EXPECT_EQ(GatePolicyName(GatePolicyKind::kAdaptive), v1::GateConfig::Policy_Name(v1::GateConfig::ADAPTIVE));
  EXPECT_EQ(GatePolicyName(GatePolicyKind::kStatic), v1::GateConfig::Policy_Name(v1::GateConfig::STATIC));
  for (int bad : {0, 3, 77, -1}) {
    v1::GateConfig layer;
    layer.set_policy(static_cast<v1::GateConfig::Policy>(bad));
    const GateConfig c = LayerGateConfig(GateConfig{}, layer);
    EXPECT_THAT(ValidateGateConfig(c),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy"))) << bad;
  }
  v1::GateConfig layer;
  layer.set_policy(v1::GateConfig::ADAPTIVE);
  EXPECT_EQ(LayerGateConfig(GateConfig{}, layer).policy, GatePolicyKind::kAdaptive);
  EXPECT_EQ(ToProto(LayerGateConfig(GateConfig{}, layer)).policy(), v1::GateConfig::ADAPTIVE);
}

}  // namespace
}  // namespace spgate

namespace spgate {
namespace {

// The learned table the daemon pushes to group leaders round-trips whole: estimates,
// the change detector's state, the bands' change steps and the switch cost, so the
// fallback decides over exactly the daemon's table (docs/design.md §11).
TEST(LearnedTableTest, RoundTripsEveryField) {
  GateConfig c;
  c.adaptive_half_life_steps = 1000;
  ThroughputTable t;
  for (int i = 0; i < 40; ++i) {
    t.Observe(c, 3, Mode::kSequenceParallel, 100 + i, 1000, 1.0);
    t.Observe(c, 3, Mode::kTensorParallelOnly, 100 + i, 1200, 1.0);
  }
  for (int i = 0; i < 8 + kChangeConfirmSamples; ++i) {
    t.Observe(c, 3, Mode::kTensorParallelOnly, 140 + i, 600, 1.0);
  }
  ASSERT_GE(t.BandChangedStep(3), 140) << "a change was detected";
  // A change on its way to confirmation: the count of samples beyond the bound.
  for (int i = 0; i < 40; ++i) t.Observe(c, 5, Mode::kSequenceParallel, 100 + i, 1000, 1.0);
  for (int i = 0; i < 6; ++i) t.Observe(c, 5, Mode::kSequenceParallel, 140 + i, 500, 1.0);
  ASSERT_LT(t.cell(5, Mode::kSequenceParallel).beyond, 0);
  ASSERT_TRUE(t.ObserveAfterSwitch(c, 3, Mode::kSequenceParallel, 150, 1000, 1.25));
  t.Observe(c, 3, Mode::kTensorParallelOnly, 151, 1100, 1.0);
  ASSERT_EQ(t.pair(3).last_step, 151) << "a probe paired with SP's level";
  // A cell's usual straggler share (and a cell without one, -1).
  t.MarkCollectivesTimed();
  t.ObserveStraggler(c, {.band = 3, .mode = Mode::kSequenceParallel, .step = 152,
                         .tokens = 1000, .seconds = 1.0, .straggler_s = 0.04, .timed = true});
  ASSERT_EQ(t.cell(3, Mode::kSequenceParallel).straggler_share, 0.04);
  ASSERT_EQ(t.cell(3, Mode::kTensorParallelOnly).straggler_share, -1);
  t.SetStragglerTiming({.timed = {true, false}, .untimed = true});
  t.SetPriorInputs(PriorInputs{8, 5120, 8});
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(t.ObserveCollectives(c, Mode::kSequenceParallel, 100 + i, 1000 * (i + 1),
                                     0.1 * i, 1.0, 0.1, 0.2 + 0.01 * i));
  }
  const ThroughputTable back = FromProto(ToProto(t));
  EXPECT_EQ(back.straggler_timing(), t.straggler_timing());
  EXPECT_EQ(back.prior_inputs(), t.prior_inputs());
  EXPECT_EQ(back.prior_sums(), t.prior_sums());
  EXPECT_EQ(back.prior_sums().last_step, 104);
  EXPECT_EQ(back, t);
  EXPECT_EQ(back.changes(), t.changes());
  EXPECT_EQ(back.switch_cost(), t.switch_cost());
  EXPECT_EQ(back.switch_cost().last_step, 150);
  EXPECT_EQ(back.pair(3), t.pair(3));
  EXPECT_EQ(FromProto(ToProto(ThroughputTable{})), ThroughputTable{});
}

// Bad values from the wire are dropped, cell by cell; nothing else is lost.
TEST(LearnedTableTest, DropsBadCellsAndBadSwitchCosts) {
  v1::LearnedTable w;
  v1::LearnedCell* good = w.add_cells();
  good->set_band(1);
  good->set_mode(v1::SEQUENCE_PARALLEL);
  good->set_tokens(100);
  good->set_seconds(1);
  good->set_weight(1);
  good->set_last_step(5);
  good->set_changed_step(-1);
  v1::LearnedCell* nan_drift = w.add_cells();
  *nan_drift = *good;
  nan_drift->set_band(2);
  nan_drift->set_drift(std::nan(""));
  v1::LearnedCell* negative_noise = w.add_cells();
  *negative_noise = *good;
  negative_noise->set_band(3);
  negative_noise->set_noise(-1);
  v1::LearnedCell* confirmed = w.add_cells();  // a change counted past its confirmation
  *confirmed = *good;
  confirmed->set_band(4);
  confirmed->set_beyond(kChangeConfirmSamples);
  v1::LearnedPair* pair = w.add_pairs();
  pair->set_band(1);
  pair->set_sp_seconds(1);
  pair->set_tp_seconds(1.1);
  pair->set_weight(2);
  pair->set_last_step(5);
  v1::LearnedPair* bad_pair = w.add_pairs();
  *bad_pair = *pair;
  bad_pair->set_band(2);
  bad_pair->set_sp_seconds(INFINITY);
  v1::LearnedPair* empty_sum = w.add_pairs();  // a weight without seconds
  *empty_sum = *pair;
  empty_sum->set_band(3);
  empty_sum->set_tp_seconds(0);
  v1::LearnedCell* wild_drift = w.add_cells();  // past what one sample's term can reach
  *wild_drift = *good;
  wild_drift->set_band(5);
  wild_drift->set_seconds_drift(kSecondsDriftMax + 1);
  v1::LearnedCell* wild_share = w.add_cells();  // a share of a step is in [0, 1]
  *wild_share = *good;
  wild_share->set_band(6);
  wild_share->set_straggler_share(1.5);
  v1::LearnedCell* nan_share = w.add_cells();
  *nan_share = *good;
  nan_share->set_band(7);
  nan_share->set_straggler_share(std::nan(""));
  w.mutable_switch_cost()->set_seconds(0.5);
  w.mutable_switch_cost()->set_weight(-2);
  w.mutable_switch_cost()->set_last_step(5);
  const ThroughputTable t = FromProto(w);
  EXPECT_EQ(t.cell(1, Mode::kSequenceParallel).last_step, 5);
  EXPECT_EQ(t.cell(2, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.cell(3, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.cell(4, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.pair(1), (PairedCell{1, 1.1, 2, 5}));
  EXPECT_EQ(t.pair(2).last_step, -1);
  EXPECT_EQ(t.pair(3).last_step, -1);
  EXPECT_EQ(t.cell(5, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.cell(6, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.cell(7, Mode::kSequenceParallel).last_step, -1);
  EXPECT_EQ(t.cell(1, Mode::kSequenceParallel).straggler_share, -1) << "unset: none known";
  EXPECT_EQ(t.switch_cost().last_step, -1);
  EXPECT_EQ(t.SwitchCostSeconds(), 0.0);
  // The prior: a negative sum drops the sums, a negative shape the declared inputs; the
  // deprecated hardware of a table written before it was dropped is ignored, even NaN.
  v1::LearnedTable p;
  p.mutable_prior()->set_tp(8);
  p.mutable_prior()->set_hidden(-1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  p.mutable_prior()->mutable_hardware()->set_link_gbps(std::nan(""));
#pragma GCC diagnostic pop
  p.mutable_prior()->set_weight(3);
  p.mutable_prior()->set_tokens(-1);
  p.mutable_prior()->set_last_step(9);
  const ThroughputTable q = FromProto(p);
  EXPECT_EQ(q.prior_inputs(), PriorInputs{});
  EXPECT_EQ(q.prior_sums(), PriorSums{});
  p.mutable_prior()->set_hidden(5120);
  p.mutable_prior()->set_tokens(5);
  EXPECT_EQ(FromProto(p).prior_inputs(), (PriorInputs{.tp = 8, .hidden = 5120}));
  EXPECT_EQ(FromProto(p).prior_sums().tokens, 5);
  // What is written carries no hardware.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_FALSE(ToProto(FromProto(p)).prior().has_hardware());
#pragma GCC diagnostic pop
}

}  // namespace
}  // namespace spgate
