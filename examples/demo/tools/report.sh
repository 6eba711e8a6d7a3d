#!/usr/bin/env bash
# Takes longer than its 1s budget; advisory enforcement keeps its result.
cat >/dev/null
sleep 2
printf '{"report": "3 budgets fired, 0 results lost"}\n'
