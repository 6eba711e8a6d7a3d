#!/usr/bin/env bash
# Ignores SIGTERM and leaves a grandchild in its own session: only a forced
# stop of the whole tree ends it.
cat >/dev/null
trap '' TERM
setsid sleep 3600 </dev/null >/dev/null 2>&1 &
echo "syncing (ignoring SIGTERM)..." >&2
while true; do sleep 1; done
