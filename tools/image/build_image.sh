#!/usr/bin/env bash
# `make image`: builds deploy/docker/Dockerfile with docker when a docker daemon answers,
# else with podman (`--format docker`, so the image keeps Docker's metadata), and tags it
# IMAGE:VERSION with the version `spgated --version` prints inside it. Missing Debian base
# images are pulled, or made here from this machine's apt sources when no registry is
# reachable (tools/image/make_base_images.sh).
#
#   tools/image/build_image.sh                 # IMAGE=ghcr.io/spgate/spgate
#   ENGINE=podman IMAGE=registry.example.com/ml/spgate tools/image/build_image.sh
#   SPGATE_BASE_IMAGES=local ...               # never pull the base images
#   STAGE=build-deps ...                       # only that stage, tagged IMAGE:STAGE
#
# Prints the tag it made as its last line. STAGE=build-deps builds the build stage's
# packages alone, ahead of the sources (.ci/run, while the tree compiles); a later
# build with the same engine and the same arguments takes those layers from its cache.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${IMAGE:-ghcr.io/spgate/spgate}
ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else echo "build_image: neither a running docker nor podman (make deps-image installs podman)" >&2; exit 1
  fi
fi
# shellcheck source=tools/image/engine.sh
. tools/image/engine.sh

tools/image/make_base_images.sh "$ENGINE"

start=$(date +%s)
build_tag=$IMAGE:build   # until the version is known; one per IMAGE, so builds do not mix
target=()
if [ -n "${STAGE:-}" ]; then build_tag=$IMAGE:$STAGE; target=(--target "$STAGE"); fi
if [ "$ENGINE" = podman ]; then
  # --format docker: the OCI format has no SHELL or HEALTHCHECK; --pull=never: the base
  # images are local now; the ignore file by name, which BuildKit finds on its own.
  "${RUN_ENGINE[@]}" build --format docker --pull=never "${ULIMITS[@]}" \
    --ignorefile deploy/docker/Dockerfile.dockerignore "${target[@]}" \
    -f deploy/docker/Dockerfile -t "$build_tag" .
else
  docker build "${target[@]}" -f deploy/docker/Dockerfile -t "$build_tag" .
fi
if [ -n "${STAGE:-}" ]; then
  echo "build_image: stage $STAGE built in $(( $(date +%s) - start )) s with $ENGINE"
  echo "$build_tag"
  exit 0
fi
# The version the binary printed during the build, read without starting the container.
cid=$("$ENGINE" create "$build_tag")
version=$("$ENGINE" cp "$cid:/usr/local/share/spgate/version" - | tar -xOf -)
"$ENGINE" rm "$cid" >/dev/null
version=${version##* }   # "spgated 0.1.0" -> "0.1.0"
[ -n "$version" ] || { echo "build_image: no version in the image" >&2; exit 1; }
"$ENGINE" tag "$build_tag" "$IMAGE:$version"
"$ENGINE" rmi "$build_tag" >/dev/null   # the tag only; the image keeps IMAGE:VERSION
echo "build_image: built in $(( $(date +%s) - start )) s with $ENGINE"
echo "$IMAGE:$version"
