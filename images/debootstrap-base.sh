#!/usr/bin/env bash
# images/debootstrap-base.sh [IMAGE]: make a Debian bookworm minbase image without a registry.
#
# The stand-in for docker.io/library/debian:12.x-slim on machines that cannot pull it: the same
# release and package set (debootstrap --variant=minbase), slim's dpkg excludes (no docs, man
# pages or locales) and its apt sources, imported into podman's storage as IMAGE (default
# localhost/kvfleet-base:bookworm). Run as root (debootstrap needs it).
#
# The tarball is cached in $KVFLEET_IMAGE_CACHE (default ~/.cache/kvfleet/images) and reused
# while present: that cache is the pin (its Debian point release is printed and stored as the
# image's label). Delete the tarball to take a newer point release. Env: DEBIAN_MIRROR
# (default http://deb.debian.org/debian).
set -euo pipefail

IMAGE=${1:-localhost/kvfleet-base:bookworm}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${KVFLEET_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfleet/images}
TARBALL=$CACHE/debian-$SUITE-minbase.tar
say() { echo "base: $*" >&2; }

if podman image exists "$IMAGE"; then
  say "$IMAGE present (Debian $(podman image inspect --format '{{index .Labels "org.debian.version"}}' "$IMAGE"))"
  exit 0
fi

if [ ! -s "$TARBALL" ]; then
  mkdir -p "$CACHE"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  say "debootstrap --variant=minbase $SUITE from $MIRROR (once; cached in $TARBALL)"
  debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
  rm -f "$root.log"
  # What debian:*-slim has: no docs (copyright files stay), man pages or translations.
  cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{man,groff,info,lintian,linda,locale}/*
  # slim's apt sources: the release, its updates and the security archive.
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
  : > "$root/etc/machine-id"
  rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
  tar --numeric-owner --sort=name --mtime=@0 -C "$root" -cf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
fi

version=$(tar -xOf "$TARBALL" ./etc/debian_version)
say "importing $TARBALL (Debian $version) as $IMAGE"
podman import -q --change "LABEL org.debian.version=$version" \
  --change 'CMD ["/bin/bash"]' "$TARBALL" "$IMAGE" > /dev/null
say "$IMAGE: $(podman image inspect --format '{{.Digest}}' "$IMAGE")"
