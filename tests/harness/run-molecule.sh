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
#   PD_MOLECULE_SIDE_LANE  scenarios run one after the other in a background lane beside the others
#                    when more than one scenario runs (default "real-engine ops reject": real-engine mostly
#                    waits for the real vLLM, and the two lanes take about as long; ports, clusters and
#                    instances of the side lane are their own, tests/render/test_molecule_inventories.py
#                    checks the ports); "" runs every scenario in order
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

# One scenario: destroy, test, destroy; its result and wall time go to $LOG_DIR/<s>.result, so a
# scenario run in the side lane (a background subshell) reports the same way as the main lane's.
# $2 = tee: the scenario's output also goes to the terminal (main lane); the side lane writes only
# its log file, printed after the main lane ends.
run_scenario() {
  local s="$1" out="$2" t0=$EPOCHREALTIME res
  log "==== scenario $s (log: $LOG_DIR/$s.log)"
  "$MOLECULE" destroy -s "$s" >"$LOG_DIR/$s.log" 2>&1 || log "molecule destroy -s $s failed (continuing)"
  if if [[ "$out" == tee ]]; then
       "$MOLECULE" test -s "$s" --destroy=never 2>&1 | tee -a "$LOG_DIR/$s.log"
     else
       "$MOLECULE" test -s "$s" --destroy=never >>"$LOG_DIR/$s.log" 2>&1
     fi; then
    res=passed
  else
    res=FAILED
    dump_containers >>"$LOG_DIR/$s.log" 2>&1
    [[ "$out" == tee ]] && dump_containers
  fi
  "$MOLECULE" destroy -s "$s" >>"$LOG_DIR/$s.log" 2>&1 || { log "molecule destroy -s $s failed"; res=FAILED; }
  printf '%s %s\n' "$res" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    >"$LOG_DIR/$s.result"
  log "==== scenario $s $res in $(cut -d' ' -f2 "$LOG_DIR/$s.result")s"
}

# The side lane: scenarios that mostly wait on a slow engine (the real vLLM's start and its requests)
# run in the background beside the others, which share neither ports, cluster names nor Molecule
# instances with them (each scenario has its own). PD_MOLECULE_SIDE_LANE="" runs everything in order.
side=()
main_lane=()
for s in "${scenarios[@]}"; do
  rm -f "$LOG_DIR/$s.result"
  if [[ " ${PD_MOLECULE_SIDE_LANE-real-engine ops reject} " == *" $s "* ]] && ((${#scenarios[@]} > 1)); then
    side+=("$s")
  else
    main_lane+=("$s")
  fi
done
side_pid=
if ((${#side[@]})); then
  log "side lane (in the background, output in their logs): ${side[*]}"
  ( for s in "${side[@]}"; do run_scenario "$s" log; done ) &
  side_pid=$!
fi
for s in "${main_lane[@]}"; do
  if [[ -f "molecule/$s/molecule.yml" ]]; then
    run_scenario "$s" tee
  else
    log "no scenario molecule/$s"
    echo "missing -" >"$LOG_DIR/$s.result"
  fi
done
if [[ -n "$side_pid" ]]; then
  log "waiting for the side lane: ${side[*]}"
  wait "$side_pid"
  for s in "${side[@]}"; do
    log "---- side lane: molecule test -s $s (last 60 lines of $LOG_DIR/$s.log) ----"
    tail -n 60 "$LOG_DIR/$s.log" >&2
  done
fi

# What made a scenario fail, printed last (just above the summary), so that a CI log cut to its tail
# still shows the cause: the failed tasks (with the lines after them), the recap and Molecule's error.
failure_excerpt() {
  local s="$1"
  log "---- why $s failed (from $LOG_DIR/$s.log; full log there) ----"
  # Molecule's console output is coloured and boxed: strip the colours before matching
  # (and the container dump appended after a failure is left out: it is printed above)
  sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e '/\[run-molecule\] docker ps -a:/,$d' "$LOG_DIR/$s.log" \
    | grep -n -A 30 -E 'fatal: \[|FAILED!|^CRITICAL|Traceback' | tail -n 150 >&2
}

failed=0
for s in "${scenarios[@]}"; do
  read -r res _ <"$LOG_DIR/$s.result" 2>/dev/null || res=FAILED
  [[ "$res" == passed || "$res" == missing ]] || failure_excerpt "$s"
done
log "summary:"
for s in "${scenarios[@]}"; do
  read -r res secs <"$LOG_DIR/$s.result" 2>/dev/null || { res=FAILED; secs=-; }
  [[ "$res" == passed ]] || failed=1
  printf '[run-molecule]   %-24s %-8s %8ss\n' "$s" "$res" "$secs" >&2
done
exit "$failed"
