#!/usr/bin/env bash
# kill-on-event.sh ACTION CONTAINER -- COMMAND...
# Run COMMAND (a deploy) and SIGKILL it, with every process of its group, the moment the Docker daemon
# reports ACTION (rename, update, start, ...) for the container named CONTAINER: an operator's kill -9,
# or a lost controller, at a chosen point of a rollout. Prints "killed at ACTION of CONTAINER after N s"
# when it did. Exit status: COMMAND's (137 when killed).
# With ON_EVENT_CMD set, that command runs at the event instead of the kill (a lost host: `docker stop`
# of a test host's container) and "ran ON_EVENT_CMD at ACTION of CONTAINER after N s" is printed.
set -u
action="$1" name="$2"
shift 3
since="$(date +%s.%N)"
t0=$EPOCHREALTIME
setsid "$@" &
run=$!
# the watcher, in a group of its own so that it can be stopped with its docker events client
# (a read loop, not a pipe into grep: the pipe would only end at docker events' next line)
setsid bash -c '
  while read -r seen; do
    if [[ "$seen" == "$3" ]]; then
      if [[ -n "${ON_EVENT_CMD:-}" ]]; then
        bash -c "$ON_EVENT_CMD" >/dev/null 2>&1
        awk -v a="$5" -v b="$EPOCHREALTIME" -v c="$ON_EVENT_CMD" -v e="$2" -v n="$3" \
          "BEGIN { printf \"ran %s at %s of %s after %.1f s\n\", c, e, n, b - a }"
      else
        kill -9 -- "-$4" 2>/dev/null
      fi
      break
    fi
  done < <(timeout --foreground 600 docker events --since "$1" --filter type=container --filter "event=$2" \
             --format "{{.Actor.Attributes.name}}")
' watcher "$since" "$action" "$name" "$run" "$t0" &
watcher=$!
wait "$run"
rc=$?
kill -- "-$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
if ((rc == 137)); then
  awk -v a="$t0" -v b="$EPOCHREALTIME" -v e="$action" -v n="$name" 'BEGIN { printf "killed at %s of %s after %.1f s\n", e, n, b - a }'
fi
exit "$rc"
