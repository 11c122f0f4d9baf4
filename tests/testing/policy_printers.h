// GoogleTest printers for the policy's value types, so a failed expectation reads
// "rs_wait" instead of "1-byte object <03>". Include it in any test that compares
// Mode, Reason or Decision values; gtest finds PrintTo by argument-dependent lookup.
//
// Usage:
//   #include "tests/testing/policy_printers.h"
//   EXPECT_EQ(out.decision.reason, spgate::Reason::kProbe);  // prints "probe" on failure
#ifndef SPGATE_TESTS_TESTING_POLICY_PRINTERS_H_
#define SPGATE_TESTS_TESTING_POLICY_PRINTERS_H_

#include <ostream>

#include "policy/types.h"

namespace spgate {

inline void PrintTo(Mode mode, std::ostream* os) { *os << ModeLabel(mode); }
inline void PrintTo(Reason reason, std::ostream* os) { *os << ReasonLabel(reason); }
inline void PrintTo(const Decision& d, std::ostream* os) {
  *os << "{" << ModeLabel(d.mode) << ", " << ReasonLabel(d.reason) << "}";
}

}  // namespace spgate

#endif  // SPGATE_TESTS_TESTING_POLICY_PRINTERS_H_
