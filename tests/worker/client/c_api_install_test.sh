#!/usr/bin/env bash
# The C API as a trainer outside this tree uses it: `cmake --install BUILD --component
# client` into a fresh prefix, then a C program compiled against the installed header
# (<spgate/spgate_client.h>) and linked with the installed libspgate_client.so only, run
# with no daemon (controller empty: the local policy decides). Fails on a missing file, a
# header that does not compile as C11 with -Werror, a library with a dependency this
# machine cannot resolve (here, where the -dev packages are installed: what a training host
# needs besides is in docs/client.md), or a wrong decision.
# Usage: c_api_install_test.sh BUILD_DIR C_COMPILER CMAKE
set -euo pipefail
build=$1
cc=$2
cmake=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --component client --prefix "$tmp/prefix" >"$tmp/install.log"
lib=$(find "$tmp/prefix" -name libspgate_client.so -print -quit)
header="$tmp/prefix/include/spgate/spgate_client.h"
[ -n "$lib" ] || { echo "FAIL: no libspgate_client.so under the prefix"; cat "$tmp/install.log"; exit 1; }
[ -f "$header" ] || { echo "FAIL: no include/spgate/spgate_client.h under the prefix"; exit 1; }
ldd "$lib" >"$tmp/ldd.txt"
if grep -q "not found" "$tmp/ldd.txt"; then
  echo "FAIL: the installed library needs libraries this machine does not have:"
  cat "$tmp/ldd.txt"
  exit 1
fi
cat >"$tmp/trainer.c" <<'C'
#include <spgate/spgate_client.h>
#include <stdio.h>
#include <string.h>

static int check(spgate_status s, const char* what) {
  if (s != SPGATE_OK) fprintf(stderr, "FAIL: %s: %s\n", what, spgate_last_error());
  return s == SPGATE_OK;
}

int main(void) {
  char cred[SPGATE_LAUNCH_CREDENTIAL_BUFFER];
  if (!check(spgate_new_launch_credential(cred, sizeof(cred)), "new_launch_credential")) return 1;
  spgate_options* o = spgate_options_create();
  if (!check(spgate_options_set(o, "job_id", "install-check"), "job_id")) return 1;
  if (spgate_options_set(o, "no_such_option", "1") == SPGATE_OK ||
      strstr(spgate_last_error(), "no_such_option") == NULL) {
    fprintf(stderr, "FAIL: an unknown option was not refused by name: %s\n", spgate_last_error());
    return 1;
  }
  spgate_client* c = NULL;
  if (!check(spgate_client_create(o, &c), "client_create")) return 1;
  spgate_options_destroy(o);
  /* Even lengths pass every gate (SP); lengths this uneven trip the length-CV gate. */
  const int64_t even[] = {4096, 4000, 4100}, uneven[] = {512, 4096, 8192};
  const int64_t* plans[] = {even, uneven};
  const int32_t want[] = {SPGATE_MODE_SEQUENCE_PARALLEL, SPGATE_MODE_TENSOR_PARALLEL_ONLY};
  for (int64_t step = 0; step < 2; ++step) {
    spgate_decision d;
    if (!check(spgate_client_submit_plan(c, step, plans[step], 3, 0, 0, 0), "submit_plan") ||
        !check(spgate_client_await_decision(c, step, 20000, &d), "await_decision")) {
      return 1;
    }
    if (d.step != step || d.mode != want[step] || d.source != SPGATE_SOURCE_LOCAL_ONLY) {
      fprintf(stderr, "FAIL: step %lld: mode %d (want %d), source %d (want local-only %d)\n",
              (long long)step, d.mode, want[step], d.source, SPGATE_SOURCE_LOCAL_ONLY);
      return 1;
    }
  }
  spgate_client_destroy(c);
  printf("ok: spgate %s, installed C API decided SP then TP-only\n", spgate_version());
  return 0;
}
C
"$cc" -std=c11 -Wall -Wextra -Werror -I"$tmp/prefix/include" "$tmp/trainer.c" \
  -L"$(dirname "$lib")" -lspgate_client -Wl,-rpath,"$(dirname "$lib")" -o "$tmp/trainer"
"$tmp/trainer"
