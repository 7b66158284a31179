#!/usr/bin/env bash
# `make test`: lint, the unit/render tests and every Molecule scenario, printing each step's wall time.
#
#   tests/harness/run-tests.sh          (from the Makefile: make test)
#
# The Molecule lanes (tests/harness/run-molecule.sh) mostly wait: engine start-ups, health waits, the
# real vLLM's requests. Lint and the unit tests run beside them, in the background and niced (they
# take the CPU the lanes leave), their output in $PD_TEST_LOGS/<step>.log (default
# /tmp/pd-test-logs); Molecule's foreground lane prints to the terminal as before. At the end: the output of a failed lint or unit step (its last 80 lines), then
# one line per step (passed/FAILED, wall time). Exit status: 0 when every step passed, 1 otherwise.
#
# Env: PD_TEST_SERIAL=1 runs lint, unit, molecule one after the other (the order of `make lint unit
# molecule`); MAKE (default make) runs the Makefile's targets, so each step has one definition.
set -uo pipefail  # no -e: a failed step must not stop the others

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
LOG_DIR="${PD_TEST_LOGS:-/tmp/pd-test-logs}"
MAKE="${MAKE:-make}"
mkdir -p "$LOG_DIR"

log() { printf '[make-test] %s\n' "$*" >&2; }

# step NAME OUT CMD...: runs CMD, writes "<rc> <seconds>" to $LOG_DIR/NAME.result; OUT = log (output
# only in $LOG_DIR/NAME.log) or tee (also on the terminal)
step() {
  local name="$1" out="$2" t0=$EPOCHREALTIME rc
  shift 2
  rm -f "$LOG_DIR/$name.result"
  if [[ "$out" == tee ]]; then
    "$@" 2>&1 | tee "$LOG_DIR/$name.log"
    rc=${PIPESTATUS[0]}
  else
    "$@" >"$LOG_DIR/$name.log" 2>&1
    rc=$?
  fi
  printf '%s %s\n' "$rc" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" \
    >"$LOG_DIR/$name.result"
  log "$name: exit $rc in $(cut -d' ' -f2 "$LOG_DIR/$name.result") s"
}

start=$EPOCHREALTIME
if [[ "${PD_TEST_SERIAL:-0}" == 1 ]]; then
  step lint tee "$MAKE" --no-print-directory lint
  step unit tee "$MAKE" --no-print-directory unit
  step molecule tee "$MAKE" --no-print-directory molecule
else
  log "lint and unit tests in the background (logs: $LOG_DIR/lint.log, $LOG_DIR/unit.log), Molecule here"
  # niced: they fill the CPU the lanes leave, and never starve a lane's engine start (the real vLLM
  # of real-engine loads its model within its health timeout on 2 cores only if it gets the CPU)
  step lint log nice -n 10 "$MAKE" --no-print-directory lint &
  lint_pid=$!
  step unit log nice -n 10 "$MAKE" --no-print-directory unit &
  unit_pid=$!
  step molecule tee "$MAKE" --no-print-directory molecule
  wait "$lint_pid" "$unit_pid"
fi

failed=0
for name in lint unit; do
  read -r rc _ <"$LOG_DIR/$name.result" 2>/dev/null || rc=1
  if [[ "$rc" != 0 && "${PD_TEST_SERIAL:-0}" != 1 ]]; then
    log "---- $name failed: last 80 lines of $LOG_DIR/$name.log ----"
    tail -n 80 "$LOG_DIR/$name.log" >&2
  fi
done
log "summary (wall time $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s):"
for name in lint unit molecule; do
  read -r rc secs <"$LOG_DIR/$name.result" 2>/dev/null || { rc=1; secs=-; }
  [[ "$rc" == 0 ]] && res=passed || { res=FAILED; failed=1; }
  printf '[make-test]   %-10s %-8s %8s s\n' "$name" "$res" "$secs" >&2
done
exit "$failed"
