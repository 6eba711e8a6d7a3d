#!/usr/bin/env bash
# Crawls N pages, reporting progress on stderr for each one.
set -euo pipefail
pages=5
if [ "${1:-}" = "--pages" ]; then pages=$2; fi
cat >/dev/null   # the request; this demo crawler ignores the URL
for i in $(seq 1 "$pages"); do
  sleep 0.4
  echo "::progress:: {\"progress\": $i, \"total\": $pages, \"message\": \"page $i of $pages\"}" >&2
done
echo "fetched robots.txt and $pages pages" >&2
printf '{"pages": %s, "status": "done"}\n' "$pages"
