#!/usr/bin/env bash
# count-lines.sh: an exec tool that counts the lines of the files under a
# directory whose names match a pattern (docs/exec-tools.md).
#
# stdin:  {"tool": "count_lines", "call_id": "...",
#          "input": {"dir": "logs", "pattern": "*.log"},
#          "deadline": "2025-01-02T15:04:05.123456789Z", "timeout_ms": 30000}
# stdout: {"files": 3, "lines": 1200, "skipped": 0, "remaining": 0, "complete": true}
# stderr: a ::progress:: line before each file; every other line is log.
set -o pipefail

IFS= read -r req   # the request: one line of JSON, then EOF

# field NAME prints the string field NAME of the request, JSON escapes
# and all: enough for plain paths. With jq: jq -r '.input.dir // "."'.
field() {
  printf '%s' "$req" | sed -E -n 's/.*"'"$1"'":"(([^"\\]|\\.)*)".*/\1/p'
}

# json_string S prints S as a JSON string.
json_string() {
  printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\000-\037')"
}

dir=$(field dir)
dir=${dir:-.}
pattern=$(field pattern)
pattern=${pattern:-*}
timeout_ms=$(printf '%s' "$req" | sed -E -n 's/.*"timeout_ms":([0-9]+).*/\1/p')

if [ ! -d "$dir" ]; then
  # A failure: the last line of stderr is what the model is told.
  echo "no such directory: $dir (dir is relative to the tool's working directory)" >&2
  exit 2
fi

files=()
while IFS= read -r -d '' f; do
  files+=("$f")
done < <(find "$dir" -name "$pattern" ! -type d -print0 | sort -z)
total=${#files[@]}
counted=0 lines=0 skipped=0

# result COMPLETE writes the result (true or false) to stdout.
result() {
  printf '{"files": %d, "lines": %d, "skipped": %d, "remaining": %d, "complete": %s}\n' \
    "$counted" "$lines" "$skipped" $((total - counted - skipped)) "$1"
}

# When the budget fires, timebox sends SIGTERM to every process of the
# call, and SIGKILL kill_grace later. Say how far it got, with builtins
# only (a command started now would be sent SIGTERM too), and exit.
trap 'echo "stopped by SIGTERM after $((counted + skipped)) of $total files" >&2
      result false
      exit 143' TERM

# Start no file with less than a second of the call's budget left, so that
# there is time to answer: a partial result beats a timeout. SECONDS counts
# the whole seconds since the script started.
stop_at=
if [ -n "$timeout_ms" ]; then stop_at=$((timeout_ms / 1000 - 1)); fi

for f in "${files[@]}"; do
  if [ -n "$stop_at" ] && [ "$SECONDS" -ge "$stop_at" ]; then
    echo "out of time: $((total - counted - skipped)) files not counted" >&2
    result false
    exit 0
  fi
  echo "::progress:: {\"progress\": $((counted + skipped)), \"total\": $total, \"message\": $(json_string "$f")}" >&2
  if n=$(wc -l < "$f"); then
    lines=$((lines + n))
    counted=$((counted + 1))
  else
    skipped=$((skipped + 1))   # the shell said why on stderr: that is the log
  fi
done
echo "::progress:: {\"progress\": $total, \"total\": $total}" >&2
result true
