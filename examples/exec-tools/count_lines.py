#!/usr/bin/env python3
"""count_lines.py: an exec tool that counts the lines of the files under a
directory whose names match a pattern (docs/exec-tools.md). The twin of
count-lines.sh, with the standard library only.

stdin:  {"tool": "count_lines_py", "call_id": "...",
         "input": {"dir": "logs", "pattern": "*.log"},
         "deadline": "2025-01-02T15:04:05.123456789Z", "timeout_ms": 30000}
stdout: {"files": 3, "lines": 1200, "skipped": 0, "remaining": 0, "complete": true}
stderr: a ::progress:: line before each file; every other line is log.
"""
import fnmatch
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone

# Start no file with less than this many seconds of the call's budget
# left, so that there is time to answer: a partial result beats a timeout.
MARGIN = 1.0


class Stopped(Exception):
    """SIGTERM: timebox is stopping the call; SIGKILL follows kill_grace later."""


def on_sigterm(signum, frame):
    raise Stopped()


def log(message):
    print(message, file=sys.stderr, flush=True)


def progress(done, total, message=None):
    report = {"progress": done, "total": total}
    if message is not None:
        report["message"] = message
    # One line, flushed at once: timebox reads progress as it comes.
    log("::progress:: " + json.dumps(report))


def deadline_of(request):
    """The call's deadline as a Unix time, or None when the call has none.
    It is UTC with up to nine decimals, which datetime.fromisoformat reads
    only from Python 3.11 on."""
    d = request.get("deadline")
    if not d:
        return None
    whole, _, decimals = d.rstrip("Z").partition(".")
    t = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return t.timestamp() + float("0." + (decimals or "0"))


def count(path):
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            n += chunk.count(b"\n")
    return n


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    request = json.loads(sys.stdin.readline())  # one line of JSON, then EOF
    args = request["input"]
    top = args.get("dir") or "."
    pattern = args.get("pattern") or "*"
    deadline = deadline_of(request)
    if not os.path.isdir(top):
        # A failure: the last line of stderr is what the model is told.
        log(f"no such directory: {top} (dir is relative to the tool's working directory)")
        return 2

    files = []
    result = {"files": 0, "lines": 0, "skipped": 0, "remaining": 0, "complete": False}
    try:
        for root, _, names in os.walk(top):
            files += [os.path.join(root, n) for n in names if fnmatch.fnmatchcase(n, pattern)]
        files.sort()
        result["remaining"] = len(files)
        for path in files:
            if deadline is not None and deadline - time.time() < MARGIN:
                log(f"out of time: {result['remaining']} files not counted")
                break
            progress(len(files) - result["remaining"], len(files), path)
            try:
                result["lines"] += count(path)
                result["files"] += 1
            except OSError as e:
                result["skipped"] += 1
                log(f"{path}: {e.strerror}")
            result["remaining"] -= 1
        if result["remaining"] == 0:
            progress(len(files), len(files))
            result["complete"] = True
    except Stopped:
        # The budget fired: say how far it got, and exit.
        log(f"stopped by SIGTERM after {len(files) - result['remaining']} of {len(files)} files")
        print(json.dumps(result))
        return 143
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
