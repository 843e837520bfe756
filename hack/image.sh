#!/usr/bin/env bash
# Builds the operator image from the Containerfile with buildah — no Docker engine and no
# registry login — then checks it: `gpu-defrag --version` runs in it (podman run, else
# buildah run --isolation chroot), it runs as 65532:65532, its entrypoint is /gpu-defrag,
# it has a CA bundle and no shell.
#
#   hack/image.sh            build and check  $IMAGE:$TAG   (make image)
#   hack/image.sh push       buildah push     $IMAGE:$TAG   (make image-push; log in first
#                                                            with `buildah login ghcr.io`)
#
# IMAGE (ghcr.io/gpu-defrag/gpu-defrag), TAG (the crate version), and BASE:
#   auto          (default) distroless when its base images can be pulled, else debian-local
#   distroless    the whole Containerfile: rust:*-bookworm builder, distroless cc-debian12
#   debian-local  for machines that reach Debian's mirrors but no image registry: a base of
#                 the distroless contents (libc6, libgcc-s1, ca-certificates, tzdata, netbase,
#                 base-files, user nonroot 65532, no shell) made from Debian 12 packages with
#                 `buildah from scratch`; the binary built here by the builder stage's own
#                 command (cargo build --release -p gpu-defrag-operator --locked, on this
#                 Debian 12 host: same glibc); then the Containerfile's runtime stage on them.
# RUST_IMAGE and BASE_IMAGE override the Containerfile's base images; REBUILD_BASE=1 remakes
# the debian-local base (localhost/gpu-defrag-base:debian12); TLS_VERIFY=false pushes to a
# plain-HTTP registry (a local test registry).
set -euo pipefail
cd "$(dirname "$0")/.."

crate_version() {
  awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && $1=="version"{gsub(/"/,"",$3); print $3; exit}' Cargo.toml
}
VERSION=$(crate_version)
IMAGE=${IMAGE:-ghcr.io/gpu-defrag/gpu-defrag}
TAG=${TAG:-$VERSION}
BASE=${BASE:-auto}
RUST_IMAGE=${RUST_IMAGE:-docker.io/library/rust:1.95-bookworm}
BASE_IMAGE=${BASE_IMAGE:-gcr.io/distroless/cc-debian12:nonroot}
LOCAL_BASE=localhost/gpu-defrag-base:debian12
REVISION=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
REF="$IMAGE:$TAG"

say() { echo "image.sh: $*" >&2; }
die() { say "$*"; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_buildah() {
  command -v buildah >/dev/null && return
  command -v apt-get >/dev/null || die "buildah is missing and this is not Debian: install buildah (and podman)"
  say "buildah is missing: installing Debian's buildah and podman with apt-get"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman >&2 \
    || { as_root apt-get update -q >&2 && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman >&2; }
}

if [ "${1:-}" = push ]; then
  need_buildah
  buildah inspect --type image "$REF" >/dev/null 2>&1 || die "no local image $REF: run make image first"
  say "pushing $REF"
  exec buildah push --tls-verify="${TLS_VERIFY:-true}" "$REF" "docker://$REF"
fi
[ $# -eq 0 ] || die "usage: hack/image.sh [push]"

need_buildah

if [ "$BASE" = auto ]; then
  if timeout 120 buildah pull -q "$BASE_IMAGE" >/dev/null 2>&1 \
     && timeout 600 buildah pull -q "$RUST_IMAGE" >/dev/null 2>&1; then
    BASE=distroless
  else
    say "cannot pull $BASE_IMAGE and $RUST_IMAGE (no registry reachable?): BASE=debian-local"
    BASE=debian-local
  fi
fi

# A base of the distroless cc-debian12 contents from Debian 12 packages, without a registry.
local_base() {
  if [ "${REBUILD_BASE:-0}" != 1 ] && buildah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
    say "base $LOCAL_BASE exists (REBUILD_BASE=1 remakes it)"
    return
  fi
  say "making $LOCAL_BASE from Debian packages"
  local debs ctr mnt
  debs=$(mktemp -d)
  chmod 0755 "$debs"
  (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root \
     base-files netbase tzdata ca-certificates libc6 libgcc-s1 >&2) \
    || die "apt-get download failed (run apt-get update?)"
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  # Debian 12's merged /usr (as debootstrap lays it): /lib64/ld-linux-x86-64.so.2 points
  # into /lib, and libc6 ships its files under /usr/lib.
  mkdir -p "$mnt"/usr/{bin,sbin,lib,lib64}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$mnt/$d"; done
  for d in "$debs"/*.deb; do
    dpkg-deb --fsys-tarfile "$d" | tar -x --keep-directory-symlink -C "$mnt"
  done
  [ -e "$mnt/lib64/ld-linux-x86-64.so.2" ] || die "no dynamic loader in the base"
  rm -rf "$debs"
  # What ca-certificates' postinst would make: the bundle rustls-native-certs reads.
  mkdir -p "$mnt/etc/ssl/certs"
  cat "$mnt"/usr/share/ca-certificates/mozilla/*.crt > "$mnt/etc/ssl/certs/ca-certificates.crt"
  [ -s "$mnt/etc/ssl/certs/ca-certificates.crt" ] || die "empty CA bundle"
  # Only what a program needs at run time; no shell was ever installed (no bash, no dash).
  rm -rf "$mnt"/usr/share/{doc,man,info,lintian,locale,ca-certificates} "$mnt"/usr/sbin/update-ca-certificates \
         "$mnt"/etc/ca-certificates.conf "$mnt"/usr/bin/ldd "$mnt"/usr/bin/tzselect
  cat > "$mnt/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat > "$mnt/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
EOF
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$mnt/etc/nsswitch.conf"
  install -d -m 0700 "$mnt/root"
  install -d -m 0700 -o 65532 -g 65532 "$mnt/home/nonroot"
  install -d -m 1777 "$mnt/tmp"
  [ ! -e "$mnt/bin/sh" ] && [ ! -e "$mnt/usr/bin/sh" ] || die "a shell in the base"
  buildah umount "$ctr" >/dev/null
  buildah config --user 65532:65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --label org.opencontainers.image.description="distroless-like base from Debian 12 packages (gpu-defrag hack/image.sh)" \
    "$ctr"
  buildah commit -q --rm "$ctr" "$LOCAL_BASE" >/dev/null
}

BUILD_ARGS=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION")
start=$(date +%s)
case "$BASE" in
  distroless)
    say "building $REF from Containerfile ($RUST_IMAGE → $BASE_IMAGE)"
    buildah build --layers -f Containerfile \
      --build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      "${BUILD_ARGS[@]}" -t "$REF" .
    ;;
  debian-local)
    grep -q '^VERSION_ID="12"' /etc/os-release \
      || die "BASE=debian-local builds the binary on this host; it must be Debian 12 (the base's glibc)"
    local_base
    say "building the binary: cargo build --release -p gpu-defrag-operator --locked"
    cargo build --release -p gpu-defrag-operator --locked --bin gpu-defrag
    bin="${CARGO_TARGET_DIR:-target}/release/gpu-defrag"
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' EXIT
    install -m 0755 "$bin" "$ctx/gpu-defrag"
    # The Containerfile's runtime stage, word for word but for where the binary comes from.
    { echo 'ARG BASE_IMAGE'
      sed -n '/^# --- runtime/,$p' Containerfile \
        | sed 's|^COPY --from=builder /out/gpu-defrag /gpu-defrag$|COPY gpu-defrag /gpu-defrag|'
    } > "$ctx/Containerfile"
    grep -q '^COPY gpu-defrag /gpu-defrag$' "$ctx/Containerfile" \
      || die "the Containerfile's runtime stage has no 'COPY --from=builder /out/gpu-defrag /gpu-defrag'"
    say "building $REF: the Containerfile's runtime stage on $LOCAL_BASE"
    buildah build --pull-never -f "$ctx/Containerfile" \
      --build-arg "BASE_IMAGE=$LOCAL_BASE" "${BUILD_ARGS[@]}" -t "$REF" "$ctx"
    ;;
  *) die "BASE=$BASE: auto, distroless or debian-local" ;;
esac
say "built $REF in $(( $(date +%s) - start ))s"

# --- checks ---
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$REF")
entry=$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$REF")
label=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}}' "$REF")
[ "$user" = 65532:65532 ] || die "user is '$user', not 65532:65532"
[ "$entry" = '[/gpu-defrag]' ] || die "entrypoint is $entry"
[ "$label" = "$VERSION" ] || die "label org.opencontainers.image.version is '$label'"
ctr=$(buildah from --pull-never "$REF")
mnt=$(buildah mount "$ctr")
for sh in bin/sh bin/bash usr/bin/sh usr/bin/bash; do
  [ ! -e "$mnt/$sh" ] || { buildah rm "$ctr" >/dev/null; die "the image has /$sh"; }
done
[ -s "$mnt/etc/ssl/certs/ca-certificates.crt" ] || { buildah rm "$ctr" >/dev/null; die "no CA bundle"; }
buildah umount "$ctr" >/dev/null
if out=$(podman run --rm --network none "$REF" --version 2>&1); then
  how="podman run"
else
  say "podman run failed ($out); trying buildah run"
  # chroot isolation needs no OCI runtime, cgroups or rlimits (sandboxes, nested containers).
  out=$(buildah run --isolation chroot "$ctr" -- /gpu-defrag --version) || { buildah rm "$ctr" >/dev/null; die "buildah run failed"; }
  how="buildah run --isolation chroot"
fi
buildah rm "$ctr" >/dev/null
[ "$out" = "gpu-defrag $VERSION" ] || die "'gpu-defrag --version' printed '$out'"
size=$(buildah images --format '{{.Size}}' "$REF" | head -1)
say "ok: $REF ($size, base $BASE, revision $REVISION): $how → '$out', user 65532:65532, no shell"
