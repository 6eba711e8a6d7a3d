#!/bin/bash
# bench/calls: a reply asking for 10,000 tool calls (default
# limits.max_tool_calls, 50) and a step of 1,000 calls run, against the
# floor of the same 1,000 processes 4 at a time (issue 29).
#
#   bench/calls/calls.sh BIN...    # e.g. a build of main and of the branch
#
# Each round runs every binary, then the floor: compare within a round.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
python3 - <<'PY'
import json
for n, name in ((10000, "a10k"), (1000, "a1k")):
    calls = [{"name": "noop", "arguments": {"i": i}} for i in range(n)]
    open(name + ".jsonl", "w").write(json.dumps({"tool_calls": calls}) + "\n" + json.dumps({"text": "done"}) + "\n")
    lim = "limits: {max_tool_calls: 1000}\n" if n == 1000 else ""
    open(name + ".yaml", "w").write("model: {primary: 'script:m'}\nproviders: {script: {file: %s.jsonl}}\n%stools:\n  - name: noop\n    exec: [\"true\"]\n" % (name, lim))
PY
export HOME=$dir
t() { /usr/bin/time -f "%e s %M KB" "$@" 2>&1 >/dev/null | tail -1; }
for round in 1 2 3; do
	for bin in "$@"; do
		echo "round $round $bin 10k store:    $(t "$bin" run -f a10k.yaml hi)"
		echo "round $round $bin 10k no store: $(t "$bin" run --no-store -f a10k.yaml hi)"
		echo "round $round $bin 1k step:      $(t "$bin" run -f a1k.yaml hi)"
	done
	echo "round $round floor 1,000 × true, 4 at a time: $(t sh -c 'seq 1000 | xargs -P4 -n1 true')"
done
