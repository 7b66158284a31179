#!/usr/bin/env bash
# Run Molecule scenarios in containers, preparing the machine first.
#
#   tests/harness/run-molecule.sh [scenario ...]    (default: every molecule/*/molecule.yml)
#
# Steps: ensure a Docker engine (installs/starts it on a fresh machine), build the test
# images (cached), create the fake Ascend tree, then for each scenario, printing its
# wall time:
#   molecule destroy -s S                  start clean (no stale state or containers)
#   molecule test -s S --destroy=never     the full sequence; on a failure the
#                                          containers stay, and `docker ps -a` and the
#                                          logs of the pd-* containers are dumped
#   molecule destroy -s S                  always: no leftovers (--destroy=never also
#                                          skips the sequence's own destroy step)
#
# Env:
#   PD_ASCEND_ROOT   fake Ascend tree (default /var/lib/pd-test/ascend), mounted in the hosts
#   PD_FAKE_NPUS     NPUs in that tree (default 8)
#   MOLECULE         molecule command (default: the repo's .venv/bin/molecule, else PATH)
#   PD_MOLECULE_LOGS directory for per-scenario logs (default /tmp/pd-molecule-logs)
# Exit status: 0 when every scenario passed, 1 otherwise.
set -uo pipefail  # no -e: one failed scenario must not stop the others

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export PD_ASCEND_ROOT="${PD_ASCEND_ROOT:-/var/lib/pd-test/ascend}"
LOG_DIR="${PD_MOLECULE_LOGS:-/tmp/pd-molecule-logs}"

log() { printf '[run-molecule] %s\n' "$*" >&2; }

# Molecule (through ansible-compat) runs ansible-config / ansible-playbook from PATH.
if [[ -x "$REPO/.venv/bin/molecule" ]]; then
  export PATH="$REPO/.venv/bin:$PATH"
fi
MOLECULE="${MOLECULE:-molecule}"
command -v "$MOLECULE" >/dev/null 2>&1 || { log "molecule not found (pip install -r requirements-dev.txt)"; exit 1; }

# Everything the scenarios need on the real machine (any failure here is fatal).
"$HERE/ensure-docker.sh" || exit 1
"$HERE/build-images.sh" || exit 1
"$HERE/ascend-root.sh" "$PD_ASCEND_ROOT" "${PD_FAKE_NPUS:-8}" || exit 1

cd "$REPO" || exit 1
scenarios=("$@")
if ((${#scenarios[@]} == 0)); then
  for f in molecule/*/molecule.yml; do
    [[ -e "$f" ]] && scenarios+=("$(basename "$(dirname "$f")")")
  done
fi
((${#scenarios[@]})) || { log "no scenario under molecule/"; exit 1; }

dump_containers() {
  log "docker ps -a:"
  docker ps -a --format 'table {{.Names}}\t{{.Image}}\t{{.Status}}\t{{.RunningFor}}' >&2 || true
  local name
  for name in $(docker ps -a --filter 'name=^pd-' --format '{{.Names}}'); do
    log "---- docker logs $name (last 80 lines) ----"
    docker logs --tail 80 "$name" >&2 2>&1 || true
  done
}

mkdir -p "$LOG_DIR"
declare -A result seconds
failed=0
for s in "${scenarios[@]}"; do
  [[ -f "molecule/$s/molecule.yml" ]] || { log "no scenario molecule/$s"; result[$s]=missing; failed=1; continue; }
  log "==== scenario $s (log: $LOG_DIR/$s.log)"
  t0=$EPOCHREALTIME
  "$MOLECULE" destroy -s "$s" >"$LOG_DIR/$s.log" 2>&1 || log "molecule destroy -s $s failed (continuing)"
  if "$MOLECULE" test -s "$s" --destroy=never 2>&1 | tee -a "$LOG_DIR/$s.log"; then
    result[$s]=passed
  else
    result[$s]=FAILED
    failed=1
    dump_containers
  fi
  "$MOLECULE" destroy -s "$s" >>"$LOG_DIR/$s.log" 2>&1 || { log "molecule destroy -s $s failed"; failed=1; }
  seconds[$s]="$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
  log "==== scenario $s ${result[$s]} in ${seconds[$s]}s"
done

log "summary:"
for s in "${scenarios[@]}"; do
  printf '[run-molecule]   %-24s %-8s %8ss\n' "$s" "${result[$s]}" "${seconds[$s]:--}" >&2
done
exit "$failed"
