#!/usr/bin/env bash
# The C API as a trainer outside this tree uses it: `cmake --install BUILD --component
# client` into a fresh prefix, then a C program compiled against the installed header
# (<spgate/spgate_client.h>) and linked with the installed libspgate_client.so only, run
# with no daemon (controller empty: the local policy decides). The program is built three
# ways: by hand (-I/-L), by a CMake project through find_package(spgate) and the target
# spgate::client, and with pkg-config's spgate-client; a find_package asking for an older
# or newer minor, or a newer major, is refused. Fails on a missing file, a header that
# does not compile as C11 with -Werror, a library with a dependency this machine cannot
# resolve (here, where the -dev packages are installed: what a training host needs besides
# is in docs/client.md), a package file that does not find what was installed, or a wrong
# decision.
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
libdir=$(dirname "$lib")
cflags=(-std=c11 -Wall -Wextra -Werror)
echo "by hand:"
"$cc" "${cflags[@]}" -I"$tmp/prefix/include" "$tmp/trainer.c" \
  -L"$libdir" -lspgate_client -Wl,-rpath,"$libdir" -o "$tmp/trainer"
"$tmp/trainer"

echo "CMake, find_package(spgate):"
mkdir -p "$tmp/cmake_trainer"
cp "$tmp/trainer.c" "$tmp/cmake_trainer/"
write_project() {  # VERSION: the project that asks for spgate VERSION
  cat >"$tmp/cmake_trainer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(trainer LANGUAGES C)
find_package(spgate $1 REQUIRED)
add_executable(trainer trainer.c)
target_compile_options(trainer PRIVATE ${cflags[*]})
target_link_libraries(trainer PRIVATE spgate::client)
CMAKE
}
version=$(sed -n 's/^Version: //p' "$libdir/pkgconfig/spgate-client.pc")
[[ "$version" =~ ^([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || {
  echo "FAIL: spgate-client.pc has no major.minor.patch Version: '$version'"; exit 1; }
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}
configure() {  # DIR: configure the project as written into DIR, log in DIR.log
  "$cmake" -S "$tmp/cmake_trainer" -B "$1" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$1.log" 2>&1
}
write_project "$major.$minor"
configure "$tmp/cmake_trainer/build" || { cat "$tmp/cmake_trainer/build.log"; exit 1; }
"$cmake" --build "$tmp/cmake_trainer/build" >>"$tmp/cmake_trainer/build.log" 2>&1 ||
  { cat "$tmp/cmake_trainer/build.log"; exit 1; }
"$tmp/cmake_trainer/build/trainer"
# Only the same major.minor is compatible while the major is 0: an older minor, a newer
# minor and a newer major are each refused, naming the version that is installed.
refused=("$major.$((minor + 1))" "$((major + 1)).0")
((minor > 0)) && refused+=("$major.$((minor - 1))")
for want in "${refused[@]}"; do
  write_project "$want"
  if configure "$tmp/cmake_trainer/build_$want"; then
    echo "FAIL: find_package(spgate $want) accepted spgate $version"
    exit 1
  fi
  grep -q "spgateConfig.cmake, version: $version" "$tmp/cmake_trainer/build_$want.log" || {
    echo "FAIL: find_package(spgate $want) failed without naming the installed $version:"
    cat "$tmp/cmake_trainer/build_$want.log"; exit 1; }
done
echo "ok: find_package(spgate ${refused[*]}) each refused (installed: $version)"

echo "pkg-config spgate-client:"
command -v pkg-config >/dev/null || { echo "FAIL: no pkg-config (make deps installs it)"; exit 1; }
# Only the fresh prefix's file (PKG_CONFIG_LIBDIR), never a copy installed elsewhere.
pc=$(PKG_CONFIG_LIBDIR="$libdir/pkgconfig" pkg-config --cflags --libs spgate-client)
[[ "$pc" == *"$libdir"* ]] || { echo "FAIL: pkg-config's flags do not name $libdir: $pc"; exit 1; }
read -r -a pc_flags <<<"$pc"
"$cc" "${cflags[@]}" "$tmp/trainer.c" "${pc_flags[@]}" -Wl,-rpath,"$libdir" -o "$tmp/trainer_pc"
"$tmp/trainer_pc"
