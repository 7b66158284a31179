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
#   PD_MOLECULE_LANES  lanes of scenarios that run at the same time, separated by ";" (each lane runs
#                    its scenarios one after the other); the first lane that has a scenario to run prints
#                    to the terminal, the others only to their logs (their tails are printed when all
#                    lanes are done). A scenario named in no lane runs in the first lane. Default:
#                    "default harness multicluster upgrade; failure reject; rolling ops; real-engine".
#                    The 2 cores mostly wait (engine start-ups, health waits, the real vLLM), so four
#                    lanes take about as long as the longest. Scenarios of different lanes share no
#                    port, container or cluster name (tests/render/test_molecule_inventories.py checks
#                    it); "" runs every scenario in one lane, in order
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
T_START=$EPOCHREALTIME

# One scenario: destroy, test, destroy; its result, wall time, start (seconds after this script's
# start) and the machine's load at its end (1 and 5 minutes) go to $LOG_DIR/<s>.result, so a scenario run in a background lane reports the same way as the
# foreground lane's. $2 = tee: the scenario's output also goes to the terminal (foreground lane); the
# other lanes write only their log files, whose tails are printed after every lane ended.
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
  printf '%s %s %s %s\n' "$res" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    "$(awk -v a="$T_START" -v b="$t0" 'BEGIN { printf "%.0f", b - a }')" "$(cut -d' ' -f1-2 /proc/loadavg)" \
    >"$LOG_DIR/$s.result"
  log "==== scenario $s $res in $(cut -d' ' -f2 "$LOG_DIR/$s.result")s"
}

# The lanes (PD_MOLECULE_LANES): each scenario goes to the lane that names it (else the first); the
# first lane with a scenario runs in the foreground (its output also on the terminal), every other in
# a background subshell. Scenarios of different lanes share no port, container, cluster or Molecule
# instance, so they do not see each other.
IFS=';' read -r -a lane_specs <<<"${PD_MOLECULE_LANES-default harness multicluster upgrade; failure reject; rolling ops; real-engine}"
((${#lane_specs[@]})) || lane_specs=("")
lanes=()
for _ in "${lane_specs[@]}"; do lanes+=(""); done
for s in "${scenarios[@]}"; do
  rm -f "$LOG_DIR/$s.result"
  lane=0
  for i in "${!lane_specs[@]}"; do
    if [[ " ${lane_specs[$i]} " == *" $s "* ]]; then lane=$i; break; fi
  done
  lanes[lane]+="$s "
done
run_lane() {  # $1 = tee | log, then the lane's scenarios
  local out="$1" s
  shift
  for s in "$@"; do
    if [[ -f "molecule/$s/molecule.yml" ]]; then
      run_scenario "$s" "$out"
    else
      log "no scenario molecule/$s"
      echo "missing -" >"$LOG_DIR/$s.result"
    fi
  done
}
fg_lane=
bg_pids=()
bg_scenarios=()
for i in "${!lanes[@]}"; do
  read -r -a members <<<"${lanes[$i]}"
  ((${#members[@]})) || continue
  if [[ -z "$fg_lane" ]]; then
    fg_lane=$i
    continue
  fi
  log "lane $((i + 1)) (in the background, output in their logs): ${members[*]}"
  run_lane log "${members[@]}" &
  bg_pids+=($!)
  bg_scenarios+=("${members[@]}")
done
read -r -a members <<<"${lanes[$fg_lane]}"
log "lane $((fg_lane + 1)) (here): ${members[*]}"
run_lane tee "${members[@]}"
if ((${#bg_pids[@]})); then
  log "waiting for the other lanes: ${bg_scenarios[*]}"
  wait "${bg_pids[@]}"
  for s in "${bg_scenarios[@]}"; do
    [[ -f "$LOG_DIR/$s.log" ]] || continue
    log "---- other lane: molecule test -s $s (last 60 lines of $LOG_DIR/$s.log) ----"
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
log "all lanes done in $(awk -v a="$T_START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s"
for s in "${scenarios[@]}"; do
  read -r res _ <"$LOG_DIR/$s.result" 2>/dev/null || res=FAILED
  [[ "$res" == passed || "$res" == missing ]] || failure_excerpt "$s"
done
log "summary:"
for s in "${scenarios[@]}"; do
  read -r res secs at l1 l5 <"$LOG_DIR/$s.result" 2>/dev/null || { res=FAILED; secs=-; }
  [[ "$res" == passed ]] || failed=1
  printf '[run-molecule]   %-24s %-8s %8ss  (started at +%ss; load at its end %s %s)\n' "$s" "$res" "$secs" \
    "${at:--}" "${l1:--}" "${l5:--}" >&2
done
exit "$failed"
