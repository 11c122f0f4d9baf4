// fake_gated: the scripted GateService of fake_gate_service.h as a process, for the Python
// package's tests (tests/python/client_test.py) that need what the real daemon never does:
// a TP-only answer its own memory gate would forbid, a session replaced on command.
//
//   fake_gated [--answer=sp|tp_only]
//
// Prints "address 127.0.0.1:PORT", then serves until stdin closes. Commands on stdin, one
// a line: "replace" ends every open stream ABORTED "session replaced"; "stats" prints
// "registrations N memory_overrides M streams S credentials C1,C2,..." (the last
// heartbeat's memory_overrides, -1 before one; the launch_credential of every Register).
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_join.h"
#include "tests/worker/client/fake_gate_service.h"

int main(int argc, char** argv) {
  spgate::client::testing::FakeGateService::Script script;
  script.heartbeat_ms = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--answer=tp_only") {
      script.answer_mode = spgate::v1::TENSOR_PARALLEL_ONLY;
      script.answer_reason = spgate::v1::LENGTH_CV;
    } else if (arg != "--answer=sp") {
      std::fprintf(stderr, "fake_gated: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  spgate::client::testing::FakeGateServer server;
  server.service().set_script(script);
  std::printf("address %s\n", server.address().c_str());
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "replace") {
      server.service().ReplaceSessions();
      std::printf("replaced\n");
    } else if (line == "stats") {
      std::printf("registrations %d memory_overrides %lld streams %d credentials %s\n",
                  server.service().registrations(),
                  static_cast<long long>(server.service().last_memory_overrides()),
                  server.service().open_streams(),
                  absl::StrJoin(server.service().launch_credentials(), ",").c_str());
    } else {
      std::printf("unknown command %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
