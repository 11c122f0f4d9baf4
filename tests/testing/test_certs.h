// A throw-away CA and certificates for the TLS tests: runs make_test_certs.sh (beside
// this header) with the openssl CLI. A missing openssl CLI is an error, so a test that
// ASSERT_OKs this fails rather than passing without TLS.
//
// Usage:
//   ASSERT_OK(spgate::testing::MakeTestCertificates(dir));
//   opts.tls_cert = dir + "/server.pem";  // also server.key, ca.pem, client.pem, client.key
//   // A client with a chosen subject and SANs, as dir/ops.pem and dir/ops.key:
//   ASSERT_OK(MakeTestCertificates(dir, "worker", {},
//                                  {{"ops", "/O=ml/CN=evil", "DNS:ops-admin"}}));
#ifndef SPGATE_TESTS_TESTING_TEST_CERTS_H_
#define SPGATE_TESTS_TESTING_TEST_CERTS_H_

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace spgate::testing {

// A further client certificate: NAME.pem/.key with this subject (openssl's -subj form,
// "/O=ml/CN=ops-admin") and subjectAltNames (openssl's form, "DNS:a,URI:spiffe://c/x";
// empty: none). The texts must not hold '|' or a single quote.
struct TestCertificate {
  std::string name;
  std::string subject;
  std::string subject_alt_names;
};

// Writes ca.pem/.key, server.pem/.key (CN=localhost, SAN localhost and 127.0.0.1),
// client.pem/.key (CN=client_cn), NAME.pem/.key (CN=NAME) for each of more_clients and
// one pair for each of `custom` into `dir`, which must exist.
inline absl::Status MakeTestCertificates(const std::string& dir,
                                         const std::string& client_cn = "worker",
                                         const std::vector<std::string>& more_clients = {},
                                         const std::vector<TestCertificate>& custom = {}) {
  const std::filesystem::path script =
      std::filesystem::path(__FILE__).parent_path() / "make_test_certs.sh";
  std::string command = absl::StrCat("bash '", script.string(), "' '", dir, "' '",
                                     client_cn, "'");
  for (const std::string& name : more_clients) absl::StrAppend(&command, " '", name, "'");
  for (const TestCertificate& c : custom) {
    absl::StrAppend(&command, " '", c.name, "|", c.subject, "|", c.subject_alt_names, "'");
  }
  if (const int rc = std::system(command.c_str()); rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        command, " failed (status ", rc, "; see its stderr, and ", dir, "/openssl.log)"));
  }
  return absl::OkStatus();
}

}  // namespace spgate::testing

#endif  // SPGATE_TESTS_TESTING_TEST_CERTS_H_
