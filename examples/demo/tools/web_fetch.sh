#!/usr/bin/env bash
# Hangs, as a fetch from an unreachable service does.
cat >/dev/null
echo "connecting to the upstream service..." >&2
printf 'partial: resolving host\n'
exec sleep 3600
