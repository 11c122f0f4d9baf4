// The launch book on its own (server/launch_book.h): each job's lease — joined only with
// its credential, refused to a new launch while its ranks are heard from or its restored
// hold lasts, taken over once they are not, never given back to a launch it replaced —
// and the launches file: written before a lease is granted, read back after a restart, a
// corrupt file refused by name and left as it was. Driven by a fake clock.
#include "server/launch_book.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/identity.h"
#include "server/persistence.h"
#include "tests/server/test_util.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kDigestA = LaunchCredentialDigest("credential-of-launch-A-0123456789");
const std::string kDigestB = LaunchCredentialDigest("credential-of-launch-B-0123456789");

class LaunchBookTest : public ::testing::Test {
 protected:
  LaunchBook Make(const std::string& state_dir = "") {
    return LaunchBook({.state_dir = state_dir,
                       .restored_hold = absl::Seconds(15),
                       .stale_after = absl::Seconds(5),
                       .clock = [this] { return clock_.Now(); },
                       .on_write_failure =
                           [this](absl::string_view what) {
                             metrics_.state_persist_failures.Increment();
                             logged_.emplace_back(what);
                           }},
                      metrics_);
  }

  FakeClock clock_;
  Metrics metrics_;
  std::vector<std::string> logged_;
};

// What the book holds for "j" before the claim: set up through its own API.
enum class Before { kNone, kLiveA, kLiveBAfterA, kReleasedA };

void Prepare(LaunchBook& book, Before before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(book.mu()) {
  if (before == Before::kNone) return;
  ASSERT_THAT(book.Take("j", "launch-A", kDigestA), IsOk());
  if (before == Before::kLiveBAfterA) {
    ASSERT_THAT(book.Take("j", "launch-B", kDigestB), IsOk());
  }
  if (before == Before::kReleasedA) book.Release("j");
}

TEST_F(LaunchBookTest, AClaimIsJoinedStartedOrRefusedByTheLease) {
  struct Case {
    const char* name;
    Before before;
    std::string incarnation, digest;
    bool ranks_heard_from;
    // Expected: a claim, or a refusal's code and words (and words it must not say).
    std::optional<LaunchBook::Claim> claim;
    absl::StatusCode code = absl::StatusCode::kOk;
    std::string says, never_says;
    bool asks_ranks = false;  // whether the lease had to ask if its ranks are heard from
  };
  const std::vector<Case> cases = {
      {"a job without a lease: the first launch starts", Before::kNone, "launch-A", kDigestA,
       true, LaunchBook::Claim::kStart, absl::StatusCode::kOk, "", "", false},
      {"the live launch with its credential joins", Before::kLiveA, "launch-A", kDigestA, true,
       LaunchBook::Claim::kJoin, absl::StatusCode::kOk, "", "", false},
      {"the live launch with another credential is refused", Before::kLiveA, "launch-A",
       kDigestB, false, std::nullopt, absl::StatusCode::kPermissionDenied,
       "launch_credential: does not match", "", false},
      {"a new launch while the live one's ranks are heard from is refused", Before::kLiveA,
       "launch-B", kDigestB, true, std::nullopt, absl::StatusCode::kFailedPrecondition,
       "held by another launch", "launch-A", /*asks_ranks=*/true},
      {"a new launch takes over once the live one's ranks have gone", Before::kLiveA,
       "launch-B", kDigestB, false, LaunchBook::Claim::kStart, absl::StatusCode::kOk, "", "",
       /*asks_ranks=*/true},
      {"a replaced launch never takes its job back, ranks or not", Before::kLiveBAfterA,
       "launch-A", kDigestA, false, std::nullopt, absl::StatusCode::kFailedPrecondition,
       "was replaced by a newer launch", "launch-B", false},
      {"a released lease holds nothing", Before::kReleasedA, "launch-B", kDigestB, true,
       LaunchBook::Claim::kStart, absl::StatusCode::kOk, "", "", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LaunchBook book = Make();
    MutexLock lock(&book.mu());
    Prepare(book, c.before);
    const std::optional<LaunchLease> before =
        book.Find("j") ? std::optional<LaunchLease>(*book.Find("j")) : std::nullopt;
    bool asked = false;
    absl::StatusOr<LaunchBook::Claim> claim =
        book.Check("j", c.incarnation, c.digest, [&] {
          asked = true;
          return c.ranks_heard_from;
        });
    if (c.claim.has_value()) {
      ASSERT_THAT(claim, IsOk());
      EXPECT_EQ(*claim, *c.claim);
    } else {
      EXPECT_THAT(claim.status(), StatusIs(c.code, HasSubstr(c.says)));
      if (!c.never_says.empty()) {
        EXPECT_THAT(claim.status().message(), Not(HasSubstr(c.never_says)));
      }
    }
    EXPECT_EQ(asked, c.asks_ranks);
    // A check changes nothing, whatever it answers.
    ASSERT_EQ(book.Find("j") != nullptr, before.has_value());
    if (before.has_value()) {
      EXPECT_EQ(book.Find("j")->incarnation, before->incarnation);
      EXPECT_EQ(book.Find("j")->credential_digest, before->credential_digest);
    }
  }
  // Each refusal counted once, by its reason.
  EXPECT_EQ(metrics_.refused_launch_credential.Value(), 1);
  EXPECT_EQ(metrics_.refused_live_incarnation.Value(), 1);
  EXPECT_EQ(metrics_.refused_stale_incarnation.Value(), 1);
}

TEST_F(LaunchBookTest, TakingOverRetiresTheOldLaunchAndKeepsTheLastSixteen) {
  LaunchBook book = Make();
  MutexLock lock(&book.mu());
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(book.Take("j", "launch-" + std::to_string(i), kDigestA), IsOk());
  }
  const LaunchLease& lease = *book.Find("j");
  EXPECT_EQ(lease.incarnation, "launch-19");
  ASSERT_EQ(lease.retired.size(), kRetiredLaunchesKept);
  EXPECT_EQ(lease.retired.front(), "launch-3");
  EXPECT_EQ(lease.retired.back(), "launch-18");
  // A release keeps the retired launches: one of them still cannot come back.
  book.Release("j");
  EXPECT_THAT(book.Check("j", "launch-18", kDigestA, [] { return false; }).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replaced")));
  // Forgetting the job forgets them too.
  book.Forget("j");
  EXPECT_EQ(book.Find("j"), nullptr);
  EXPECT_THAT(book.Check("j", "launch-18", kDigestA, [] { return false; }),
              IsOkAndHolds(LaunchBook::Claim::kStart));
}

TEST_F(LaunchBookTest, LeasesSurviveARestartAndARestoredOneHoldsItsJobForAWhile) {
  const std::string dir = TempDir();
  const absl::Time started = clock_.Now();
  {
    LaunchBook book = Make(dir);
    MutexLock lock(&book.mu());
    ASSERT_THAT(book.Take("j", "launch-A", kDigestA), IsOk());
    clock_.Advance(absl::Seconds(60) + absl::Nanoseconds(123'456'789));  // kept to the ns
    ASSERT_THAT(book.Take("j", "launch-B", kDigestB), IsOk());
    ASSERT_THAT(book.Take("k", "launch-K", kDigestA), IsOk());
    ASSERT_THAT(book.Take("idle", "launch-I", kDigestA), IsOk());
    book.Release("idle");  // a released lease is not written down
    ASSERT_THAT(book.Take("gone", "launch-G", kDigestA), IsOk());
    book.Forget("gone");
    ASSERT_THAT(book.Save(), IsOk());
  }
  // The file holds digests only; "idle" and "gone" are not in it.
  EXPECT_THAT(ReadAll(LaunchesFilePath(dir)),
              AllOf(HasSubstr(kDigestB), Not(HasSubstr("launch-I")), Not(HasSubstr("launch-G"))));

  clock_.Advance(absl::Seconds(1));
  LaunchBook book = Make(dir);
  MutexLock lock(&book.mu());
  absl::StatusOr<std::vector<LaunchBook::Restored>> restored = book.Restore();
  ASSERT_THAT(restored, IsOk());
  std::vector<std::string> jobs;
  for (const LaunchBook::Restored& r : *restored) jobs.push_back(r.job_id + "=" + r.incarnation);
  EXPECT_THAT(jobs, ElementsAre("j=launch-B", "k=launch-K"));
  const LaunchLease& j = *book.Find("j");
  EXPECT_EQ(j.credential_digest, kDigestB);
  EXPECT_THAT(j.retired, ElementsAre("launch-A"));
  EXPECT_EQ(j.start, started + absl::Seconds(60) + absl::Nanoseconds(123'456'789));
  EXPECT_EQ(book.Find("idle"), nullptr);
  // The credential and the replaced launch are kept as they were.
  EXPECT_THAT(book.Check("j", "launch-B", kDigestA, [] { return false; }).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(book.Check("j", "launch-A", kDigestA, [] { return false; }).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replaced")));
  // No rank of launch-B is known yet, but it holds its job for the restored hold (15 s),
  // and the refusal says so (not --stale_after's wait, which the hold outlasts).
  EXPECT_THAT(book.Check("j", "launch-C", kDigestA, [] { return false; }).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("incarnation: job j is held by a launch the daemon read back "
                                 "after its restart, for 15s (its ranks' time to come back); "
                                 "launch \"launch-C\" is accepted after that if none of them "
                                 "is back, in 15s at the earliest")));
  clock_.Advance(absl::Seconds(14));
  EXPECT_THAT(book.Check("j", "launch-C", kDigestA, [] { return false; }).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in 1s at the earliest")));
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(book.Check("j", "launch-C", kDigestA, [] { return false; }),
              IsOkAndHolds(LaunchBook::Claim::kStart));
}

TEST_F(LaunchBookTest, ACorruptLaunchesFileIsRefusedByNameAndLeftAsItWas) {
  const std::string good_digest = kDigestA;
  struct Case {
    const char* name;
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"does not parse", "launches { job_id: ", "not a valid"},
      {"no incarnation",
       "launches { job_id: \"j\" credential_sha256: \"" + good_digest + "\" }",
       "a launch needs job_id, incarnation"},
      {"a digest that is not 64 hex digits",
       "launches { job_id: \"j\" incarnation: \"A\" credential_sha256: \"abc\" }",
       "64-digit credential_sha256"},
      {"no job id",
       "launches { incarnation: \"A\" credential_sha256: \"" + good_digest + "\" }",
       "a launch needs job_id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = TempDir();
    std::ofstream(LaunchesFilePath(dir)) << c.text;
    LaunchBook book = Make(dir);
    MutexLock lock(&book.mu());
    EXPECT_THAT(book.Restore().status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(LaunchesFilePath(dir)), HasSubstr(c.says),
                               HasSubstr("never replaced"))));
    EXPECT_EQ(book.Find("j"), nullptr);
    EXPECT_EQ(ReadAll(LaunchesFilePath(dir)), c.text) << "the file is left as it was";
  }
}

TEST_F(LaunchBookTest, ALeaseThatCannotBeWrittenIsNotGranted) {
  const std::string dir = TempDir();
  LaunchBook book = Make(dir);
  MutexLock lock(&book.mu());
  ASSERT_THAT(book.Take("j", "launch-A", kDigestA), IsOk());
  // The file's name taken by a directory: the write fails (as root too).
  std::filesystem::remove(LaunchesFilePath(dir));
  std::filesystem::create_directory(LaunchesFilePath(dir));
  EXPECT_THAT(book.Take("j", "launch-B", kDigestB),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("cannot persist the new launch of job j"),
                             HasSubstr("nothing changed"))));
  EXPECT_EQ(book.Find("j")->incarnation, "launch-A");
  EXPECT_EQ(book.Find("j")->credential_digest, kDigestA);
  EXPECT_TRUE(book.Find("j")->retired.empty());
  EXPECT_THAT(book.Save(), Not(IsOk()));
  EXPECT_EQ(metrics_.state_persist_failures.Value(), 2);
  // Each failed write is logged too, naming the file (the refused Register's caller sees
  // the error; the daemon's log would otherwise say nothing).
  ASSERT_EQ(logged_.size(), 2u);
  EXPECT_THAT(logged_[0], AllOf(HasSubstr("cannot persist the new launch of job j"),
                                HasSubstr(LaunchesFilePath(dir))));
  EXPECT_THAT(logged_[1], HasSubstr(LaunchesFilePath(dir)));
}

TEST_F(LaunchBookTest, WithoutAStateDirNothingIsWrittenOrRead) {
  LaunchBook book = Make();
  MutexLock lock(&book.mu());
  EXPECT_EQ(book.path(), "");
  ASSERT_THAT(book.Take("j", "launch-A", kDigestA), IsOk());
  EXPECT_THAT(book.Save(), IsOk());
  absl::StatusOr<std::vector<LaunchBook::Restored>> restored = book.Restore();
  ASSERT_THAT(restored, IsOk());
  EXPECT_TRUE(restored->empty());
  EXPECT_EQ(book.Find("j")->incarnation, "launch-A");
}

}  // namespace
}  // namespace spgate::server
