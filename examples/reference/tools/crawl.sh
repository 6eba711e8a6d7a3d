#!/usr/bin/env bash
# Crawls a few pages, reporting progress on stderr for each one
# (::progress:: lines; every other stderr line is the tool's log).
set -euo pipefail
depth=1
if [ "${1:-}" = "--depth" ]; then depth=$2; fi
cat >/dev/null   # the request: {"tool", "call_id", "input", "deadline", "timeout_ms"}
pages=$((depth * 3))
for i in $(seq 1 "$pages"); do
  sleep 0.2
  echo "::progress:: {\"progress\": $i, \"total\": $pages, \"message\": \"page $i of $pages\"}" >&2
done
printf '{"pages": %s}\n' "$pages"
