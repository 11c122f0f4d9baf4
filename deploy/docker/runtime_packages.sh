#!/bin/sh
# Which Debian packages the runtime stage must install: the owners of every shared library
# the binaries in BIN_DIR load, one per line into OUT. Fails — so the image build fails —
# when a library is not found or no Debian package owns it (a copy under /usr/local, a
# vendored .so): the runtime stage could not install it and the binary would not start.
#
#   sh deploy/docker/runtime_packages.sh /out/bin /out/runtime-packages.txt
#
# POSIX sh with `set -eu` and no pipelines, because a RUN's shell is not ours to choose:
# the OCI image format (podman's default) has no SHELL, so RUN is /bin/sh without pipefail,
# and a pipeline would lose the failure of any step but its last.
set -eu
bin_dir=$1
out=$2
work=$(mktemp -d)
for b in "$bin_dir"/*; do
  ldd "$b" >>"$work/ldd" || { echo "runtime_packages: ldd $b failed" >&2; exit 1; }
done
if grep -q 'not found' "$work/ldd"; then
  echo "runtime_packages: libraries not found:" >&2
  grep 'not found' "$work/ldd" >&2
  exit 1
fi
awk '/=> \// { print $3 }' "$work/ldd" >"$work/libs"
sort -u "$work/libs" >"$work/libs.sorted"
: >"$work/owners"
while read -r lib; do
  # ldd may name a library by its /lib path (usrmerge) or by a symlink; dpkg knows one.
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null \
            || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) \
    || { echo "runtime_packages: no Debian package owns $lib" >&2; exit 1; }
  echo "${owner%%:*}" >>"$work/owners"
done <"$work/libs.sorted"
sort -u "$work/owners" >"$out"
rm -rf "$work"
cat "$out"
