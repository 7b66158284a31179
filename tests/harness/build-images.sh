#!/usr/bin/env bash
# Build the local test images (no container registry is reachable: everything is
# built here from Debian packages and the fixture files of this repository).
#
#   pd-test/base:bookworm                  debootstrap'ed Debian 12 minbase + python3,
#                                          imported with `docker import`; cached by tag.
#   pd-test/ascend-host:latest             a simulated Ascend host for Molecule
#                                          (tests/fixtures/images/ascend-host/)
#   pd-test/vllm-ascend-standin:latest     stand-in engine (`vllm serve`) + stand-in PD proxy
#                                          (tests/fixtures/images/vllm_ascend_standin/)
#   pd-test/vllm-cpu:0.27.1                the REAL engine: vLLM's CPU build (vllm-cpu 0.27.1) in a
#                                          venv + vllm-ascend's proxy from its PyPI sdist + the tiny
#                                          model generator (tests/fixtures/images/vllm_cpu/)
#   pd-test/registry:2.8                   Debian's docker-registry package, the registry
#                                          molecule/default pulls from (tests/fixtures/images/registry/)
#   pd-test/bare-host:latest               a simulated Ascend host WITHOUT Docker, systemd as PID 1, apt
#                                          reading only a local file repository holding docker.io and its
#                                          dependencies (downloaded here from the Debian mirror), for
#                                          molecule/bootstrap (tests/fixtures/images/bare-host/)
#
# The test images carry the label pd.test.context-hash (sha256 over their build context
# and the base image id); they are rebuilt only when that hash changes. vllm-cpu is
# built with `docker run` + `docker commit` rather than a Dockerfile, because its torch
# CPU wheel is not on PyPI: the host's pip fetches it (its find-links / extra index) and
# the build container gets it as a read-only mount, which `docker build` cannot do.
#
# Usage: tests/harness/build-images.sh [base|ascend-host|standin|registry|bare-host|vllm-cpu ...]   (default: all)
# Env:
#   PD_REBUILD=1        rebuild everything, ignoring the caches
#   PD_DEBIAN_MIRROR    Debian mirror for debootstrap (default: the host's apt source)
#   PD_WHEEL_DIR        where the host's pip puts the torch CPU wheel (default /var/lib/pd-test/wheels)
#   PD_PIP              the host's pip (default: the repository's .venv/bin/pip, else python3 -m pip)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
IMAGES_DIR="$REPO/tests/fixtures/images"

BASE_TAG="pd-test/base:bookworm"
HOST_TAG="pd-test/ascend-host:latest"
STANDIN_TAG="pd-test/vllm-ascend-standin:latest"
VLLM_CPU_TAG="pd-test/vllm-cpu:0.27.1"
REGISTRY_TAG="pd-test/registry:2.8"
BARE_HOST_TAG="pd-test/bare-host:latest"
VLLM_CPU_BUILDER="pd-test-build-vllm-cpu"
HASH_LABEL="pd.test.context-hash"
# Packages of the base image: python3 so Ansible can run inside, python3-requests so
# the community.docker modules work, the rest for debugging a container by hand.
BASE_PACKAGES="python3,python3-apt,python3-requests,sudo,procps,iproute2"
FALLBACK_MIRROR="http://deb.debian.org/debian"

log() { printf '[build-images] %s\n' "$*" >&2; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror this machine's apt already uses for bookworm, so debootstrap
# goes where apt goes. deb822 first (Debian 12 default), then the one-line format.
debian_mirror() {
  if [[ -n "${PD_DEBIAN_MIRROR:-}" ]]; then
    echo "$PD_DEBIAN_MIRROR"
    return
  fi
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # Stanzas are separated by blank lines; take the URIs of a stanza whose Suites
    # contain bookworm and whose URI is not a security archive.
    uri="$(awk '
      BEGIN { RS = ""; FS = "\n" }
      /Suites:[^\n]*bookworm([ \t\n]|$)/ {
        for (i = 1; i <= NF; i++)
          if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/);
                               if (u[1] !~ /security/) { print u[1]; exit } }
      }' "$f")"
    if [[ -n "$uri" ]]; then echo "$uri"; return; fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    uri="$(awk '$1 == "deb" && $0 ~ / bookworm / && $0 !~ /security/ {
                  for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' "$f")"
    if [[ -n "$uri" ]]; then echo "$uri"; return; fi
  done
  echo "$FALLBACK_MIRROR"
}

# Runs in a subshell so its EXIT trap removes the temporary rootfs whatever happens.
build_base() (
  if [[ "${PD_REBUILD:-0}" != 1 ]] && image_exists "$BASE_TAG"; then
    log "$BASE_TAG exists (cached by tag; PD_REBUILD=1 to rebuild)"
    return
  fi
  command -v debootstrap >/dev/null 2>&1 || {
    log "debootstrap is missing: run tests/harness/ensure-docker.sh first"
    exit 1
  }
  local mirror rootfs
  mirror="$(debian_mirror)"
  rootfs="$(mktemp -d /tmp/pd-test-rootfs.XXXXXX)"
  # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
  trap "rm -rf '$rootfs' '$rootfs.log'" EXIT
  log "debootstrap bookworm from $mirror into $rootfs"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || {
    log "debootstrap failed; last lines of $rootfs.log:"
    tail -n 30 "$rootfs.log" >&2
    exit 1
  }
  rm -f "$rootfs.log"
  # Smaller image: no package caches or lists (the images install nothing at run time).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV LANG=C.UTF-8' \
    --message "pd-test base: debootstrap --variant=minbase bookworm" \
    - "$BASE_TAG" >/dev/null
  log "imported $BASE_TAG"
)

# sha256 over every file of a build context (path + content) and the base image id.
context_hash() {
  local dir="$1" base_id
  base_id="$(docker image inspect --format '{{.Id}}' "$BASE_TAG")"
  {
    echo "base=$base_id"
    (cd "$dir" && find . -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -d' ' -f1
}

build_test_image() {
  local tag="$1" dir="$2" want have
  image_exists "$BASE_TAG" || build_base
  want="$(context_hash "$dir")"
  have="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$tag" 2>/dev/null || true)"
  if [[ "${PD_REBUILD:-0}" != 1 && "$want" == "$have" ]]; then
    log "$tag is up to date (context hash ${want:0:12})"
    return
  fi
  log "building $tag from ${dir#"$REPO"/} (context hash ${want:0:12})"
  # The legacy builder resolves FROM pd-test/base:bookworm locally and never pulls;
  # --network host lets a RUN apt-get reach the Debian mirror without a bridge.
  DOCKER_BUILDKIT=0 docker build --quiet --network host \
    --label "$HASH_LABEL=$want" -t "$tag" "$dir" >/dev/null
  log "built $tag"
}

# The torch wheel the requirements pin (a local version such as 2.13.0+cpu is not on PyPI), fetched
# by the host's pip with the host's configuration into PD_WHEEL_DIR; kept there between builds.
fetch_torch_wheel() {
  local dir="$1" pin pip
  pin="$(grep -E '^torch==' "$IMAGES_DIR/vllm_cpu/requirements.txt")"
  mkdir -p "$dir"
  if compgen -G "$dir/torch-${pin#torch==}-*.whl" >/dev/null; then
    return
  fi
  if [[ -n "${PD_PIP:-}" ]]; then
    pip="$PD_PIP"
  elif [[ -x "$REPO/.venv/bin/pip" ]]; then
    pip="$REPO/.venv/bin/pip"
  else
    pip="python3 -m pip"
  fi
  log "fetching $pin with the host's pip ($pip) into $dir"
  # shellcheck disable=SC2086  # "python3 -m pip" is three words
  $pip download --quiet --no-deps --only-binary :all: --dest "$dir" "$pin" || {
    log "$pin not found by the host's pip: it is PyTorch's CPU wheel, not on PyPI; put it in $dir"
    log "(or point pip's find-links / extra index at a directory or index that has it)"
    exit 1
  }
}

# pd-test/vllm-cpu: base + install.sh in a container (host network, host CA bundle, torch wheel
# mounted), committed with PATH, label and command. The builder container is removed afterwards.
build_vllm_cpu() {
  local dir="$IMAGES_DIR/vllm_cpu" want have wheels="${PD_WHEEL_DIR:-/var/lib/pd-test/wheels}"
  image_exists "$BASE_TAG" || build_base
  want="$(context_hash "$dir")"
  have="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$VLLM_CPU_TAG" 2>/dev/null || true)"
  if [[ "${PD_REBUILD:-0}" != 1 && "$want" == "$have" ]]; then
    log "$VLLM_CPU_TAG is up to date (context hash ${want:0:12})"
    return
  fi
  fetch_torch_wheel "$wheels"
  log "building $VLLM_CPU_TAG from ${dir#"$REPO"/} (context hash ${want:0:12})"
  docker rm -f "$VLLM_CPU_BUILDER" >/dev/null 2>&1 || true
  if ! docker run --name "$VLLM_CPU_BUILDER" --network host \
      -v /etc/ssl/certs:/etc/ssl/certs:ro -v "$dir":/ctx:ro -v "$wheels":/wheels:ro \
      "$BASE_TAG" bash /ctx/install.sh >&2; then
    docker rm -f "$VLLM_CPU_BUILDER" >/dev/null 2>&1 || true
    log "building $VLLM_CPU_TAG failed (output above)"
    exit 1
  fi
  docker commit \
    --change 'ENV PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PYTHONUNBUFFERED=1' \
    --change 'WORKDIR /workspace' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL $HASH_LABEL=$want" \
    --change 'LABEL org.opencontainers.image.title="pd-test vllm-cpu"' \
    --change 'LABEL org.opencontainers.image.description="TEST FIXTURE: vLLM CPU build + vllm-ascend proxy"' \
    --message "pd-test vllm-cpu: tests/fixtures/images/vllm_cpu/install.sh" \
    "$VLLM_CPU_BUILDER" "$VLLM_CPU_TAG" >/dev/null
  docker rm -f "$VLLM_CPU_BUILDER" >/dev/null
  log "built $VLLM_CPU_TAG"
}

# Run "$@" and print how long it took (bash 5's EPOCHREALTIME, no external tools).
timed() {
  local name="$1" t0=$EPOCHREALTIME
  shift
  "$@"
  awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" \
    'BEGIN { printf "[build-images] time %-12s %6.1fs\n", n, b - a }' >&2
}

main() {
  local targets=("$@")
  ((${#targets[@]})) || targets=(base ascend-host standin registry bare-host vllm-cpu)
  local t
  for t in "${targets[@]}"; do
    case "$t" in
      base) timed base build_base ;;
      ascend-host) timed ascend-host build_test_image "$HOST_TAG" "$IMAGES_DIR/ascend-host" ;;
      standin) timed standin build_test_image "$STANDIN_TAG" "$IMAGES_DIR/vllm_ascend_standin" ;;
      registry) timed registry build_test_image "$REGISTRY_TAG" "$IMAGES_DIR/registry" ;;
      bare-host) timed bare-host build_test_image "$BARE_HOST_TAG" "$IMAGES_DIR/bare-host" ;;
      vllm-cpu) timed vllm-cpu build_vllm_cpu ;;
      *) log "unknown target '$t' (base, ascend-host, standin, registry, bare-host, vllm-cpu)"; exit 2 ;;
    esac
  done
  docker image ls --filter 'reference=pd-test/*' \
    --format '[build-images] image {{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' >&2
}

main "$@"
