#!/usr/bin/env bash
# Makes the Debian base images deploy/docker/Dockerfile builds FROM — debian:bookworm and
# debian:bookworm-slim — on a machine that cannot reach a container registry, the way the
# official ones are made (debuerreotype): `debootstrap --variant=minbase` from this
# machine's own apt sources, apt's lists and caches removed, and for -slim the
# documentation, man pages and locales removed and excluded from later installs.
# An image that already exists locally is left alone; with SPGATE_BASE_IMAGES=auto (the
# default) each missing one is pulled first and made here only if the pull fails.
#
#   tools/image/make_base_images.sh [docker|podman]      # default: what `make image` uses
#   SPGATE_BASE_IMAGES=local tools/image/make_base_images.sh podman   # never pull
#   DEBIAN_MIRROR=http://deb.debian.org/debian ...       # default: this machine's sources
#
# Needs root (debootstrap) and the debootstrap package (`make deps-image` installs it).
set -euo pipefail

ENGINE=${1:-${ENGINE:-}}
if [ -z "$ENGINE" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi
fi
RELEASE=${DEBIAN_RELEASE:-bookworm}
MODE=${SPGATE_BASE_IMAGES:-auto}
FULL=debian:$RELEASE
SLIM=debian:$RELEASE-slim

have() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

missing=()
for image in "$FULL" "$SLIM"; do
  have "$image" && continue
  if [ "$MODE" = auto ] && timeout 120 "$ENGINE" pull -q "docker.io/library/$image" >/dev/null 2>&1; then
    [ "$ENGINE" = podman ] || continue
    "$ENGINE" tag "docker.io/library/$image" "$image"   # podman keeps the registry in the name
    continue
  fi
  missing+=("$image")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "make_base_images: $FULL and $SLIM present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "make_base_images: needs debootstrap (make deps-image)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "make_base_images: debootstrap needs root" >&2; exit 1; }

# The mirror: DEBIAN_MIRROR, else the first Debian URI in this machine's apt sources.
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
             | grep -v security | grep -oE 'https?://[^ ]+/debian/?' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

work=$(mktemp -d /var/tmp/spgate-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
echo "make_base_images: debootstrap --variant=minbase $RELEASE from $mirror"
debootstrap --variant=minbase "$RELEASE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }

# apt sources: this machine's Debian ones (deb822 or one-line), else the mirror.
rm -f "$root/etc/apt/sources.list"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/debian.sources"
else
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: $RELEASE $RELEASE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian*}/debian-security
Suites: $RELEASE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi
# What the official images carry: no apt caches kept, no recommends' index languages.
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
       "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/*
: >"$root/etc/machine-id"

import() {  # import IMAGE: the rootfs as a one-layer image
  tar --numeric-owner --xattrs -C "$root" --exclude='./dev/*' --exclude='./proc/*' \
      --exclude='./sys/*' -cf - . \
    | "$ENGINE" import --change 'CMD ["bash"]' - "$1" >/dev/null
  echo "make_base_images: made $1"
}
for image in "${missing[@]}"; do [ "$image" = "$FULL" ] && import "$FULL"; done
if [[ " ${missing[*]} " == *" $SLIM "* ]]; then
  # -slim (debuerreotype-slimify): documentation, man pages and locales out, and kept out.
  mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
DPKG
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
  import "$SLIM"
fi
