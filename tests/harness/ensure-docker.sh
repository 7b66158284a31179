#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`.
#
# On a developer machine dockerd usually runs already: then this script only
# checks and exits 0. On a fresh CI machine (Debian 12, root, apt only) it
# installs docker.io (and debootstrap, which build-images.sh needs), starts
# /usr/sbin/dockerd in the background and waits up to 60 s for it.
#
# Idempotent: safe to call any number of times, from any directory.
# Env:
#   PD_DOCKERD_LOG   where dockerd's output goes (default /tmp/pd-test-dockerd.log)
#   PD_DOCKER_WAIT   seconds to wait for the daemon (default 60)
set -euo pipefail

log() { printf '[ensure-docker] %s\n' "$*" >&2; }

DOCKERD_LOG="${PD_DOCKERD_LOG:-/tmp/pd-test-dockerd.log}"
WAIT_SECONDS="${PD_DOCKER_WAIT:-60}"

docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

if docker_ok; then
  log "docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
  # debootstrap is still needed by build-images.sh; install it alone if missing.
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
  log "docker is not reachable and this script is not root: cannot install or start it"
  exit 1
fi

# Install what is missing, in one apt transaction.
missing=()
command -v dockerd >/dev/null 2>&1 || [[ -x /usr/sbin/dockerd ]] || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Start the daemon unless one is already starting (pid file of a live dockerd).
if [[ -s /var/run/docker.pid ]] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  log "dockerd process exists, waiting for it to answer"
else
  log "starting /usr/sbin/dockerd (log: $DOCKERD_LOG)"
  # containerd is started by dockerd itself when it is not running as a service.
  nohup /usr/sbin/dockerd >>"$DOCKERD_LOG" 2>&1 &
fi

for ((i = 0; i < WAIT_SECONDS; i++)); do
  if docker_ok; then
    log "docker engine is up after ${i}s"
    exit 0
  fi
  sleep 1
done

log "docker did not answer within ${WAIT_SECONDS}s; last lines of $DOCKERD_LOG:"
tail -n 40 "$DOCKERD_LOG" >&2 || true
exit 1
