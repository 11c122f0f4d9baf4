# Sourced by the tools/image scripts and tests/deploy/image_test.sh once ENGINE is set:
# shellcheck shell=bash
# RUN_ENGINE (the engine with its global flags) and ULIMITS (per-container limits) for the
# VMs podman meets here — crun refuses their hybrid cgroups (runc is used when present),
# and podman's default ulimits (nofile 1048576) exceed their hard limits, so a container
# gets the host's own hard limits instead.
RUN_ENGINE=("$ENGINE")
ULIMITS=()
if [ "$ENGINE" = podman ]; then
  if command -v runc >/dev/null; then RUN_ENGINE+=(--runtime "$(command -v runc)"); fi
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] || ULIMITS+=(--ulimit "nofile=$nofile:$nofile")
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  ULIMITS+=(--ulimit "nproc=$nproc:$nproc")
fi
