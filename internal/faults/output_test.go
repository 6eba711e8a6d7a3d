//go:build faults && linux

package faults

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/event"
)

// Tool programs that write what a careless or broken program writes.
const (
	// 1 GiB of text lines on stdout.
	gibStdout = `#!/usr/bin/env bash
cat >/dev/null
yes 'all work and no play makes jack a dull boy' | head -c 1073741824
`
	// 1 GiB of log lines on stderr (8 × 2^20 lines of 128 bytes), a
	// progress report before each eighth, and a short result.
	gibStderr = `#!/usr/bin/env bash
cat >/dev/null
for i in 1 2 3 4 5 6 7 8; do
  echo "::progress:: {\"progress\": $i, \"total\": 8}" >&2
  yes "$(printf '%-127s' "log line $i: all work and no play makes jack a dull boy")" | head -n 1048576 >&2
done
echo -n 'logged'
`
	// 1 GiB on stdout, then a last line, and a failure: the model's
	// partial_output is the end of what it wrote.
	gibStdoutFails = `#!/usr/bin/env bash
cat >/dev/null
yes 'all work and no play makes jack a dull boy' | head -c 1073741824
echo 'the last line, which says what went wrong'
exit 1
`
	// One line of 100 MB, without a newline, on stdout.
	lineStdout = `#!/usr/bin/env bash
cat >/dev/null
head -c 100000000 /dev/zero | tr '\0' 'x'
`
	// The same on stderr, then a last log line that becomes the error
	// message of a failing call.
	lineStderr = `#!/usr/bin/env bash
cat >/dev/null
head -c 100000000 /dev/zero | tr '\0' 'x' >&2
printf '\nfailed after a long line\n' >&2
exit 3
`
	// Bytes that are not UTF-8, and NULs, on stdout, stderr and in
	// progress reports.
	badBytes = `#!/usr/bin/env bash
cat >/dev/null
printf 'ok \xff\xfe\x00 nul \xc3\x28 end'
printf 'log \xff\x00 bad \xe2\x82\n' >&2
printf '::progress:: {"message": "half \xe2\x82 and \xc0\xaf"}\n' >&2
printf '::progress:: \xff\xfe\x00\n' >&2
printf 'last \xff\n' >&2
`
)

// outputFloods: a tool that writes a gigabyte, a line of 100 MB, or
// bytes that are not text, through `timebox run` with the store on. The
// call ends as the program does; what is kept is bounded (1 MiB of result,
// 4 KiB of stderr tail) and valid UTF-8, the stored record is the emitted
// one, and timebox's memory stays small whatever the program writes.
func outputFloods(t *testing.T) {
	cases := []struct {
		name, program string
		outcome       event.Outcome
		// result is the bytes of result kept; -1: not checked. A
		// truncated result ends with a note saying so.
		result    int
		truncated bool
		progress  int
		memoryMB  int
		// floor: the call's duration is set against the program's with
		// its output piped to cat, the floor of any reader.
		floor bool
		check func(t *testing.T, sc *scenario, rec *event.ToolFinished)
	}{
		{name: "1 GiB stdout", program: gibStdout, outcome: event.OutcomeOK, result: 1 << 20, truncated: true, memoryMB: 150, floor: true},
		{name: "1 GiB stdout, then a failure", program: gibStdoutFails, outcome: event.OutcomeError, result: -1, memoryMB: 150,
			check: func(t *testing.T, sc *scenario, rec *event.ToolFinished) {
				var r struct {
					Error struct {
						Partial   string `json:"partial_output"`
						Truncated bool   `json:"partial_output_truncated"`
					} `json:"error"`
				}
				json.Unmarshal([]byte(rec.Result), &r)
				p := r.Error.Partial
				sc.truth("the model's partial_output", "≤ 16 KiB, the end of what the tool wrote, said to be cut",
					fmt.Sprintf("%s ending %q, cut %v", byteCount(len(p)), p[max(0, len(p)-42):], r.Error.Truncated),
					len(p) <= 16<<10 && strings.HasSuffix(p, "the last line, which says what went wrong\n") && r.Error.Truncated)
				sc.truth("the record says truncated", "true", fmt.Sprint(rec.Truncated), rec.Truncated)
			}},
		{name: "1 GiB stderr", program: gibStderr, outcome: event.OutcomeOK, result: len("logged"), progress: 8, memoryMB: 150, floor: true,
			check: func(t *testing.T, sc *scenario, rec *event.ToolFinished) {
				sc.truth("stderr tail kept", "≤ 4 KiB", byteCount(len(rec.StderrTail)), len(rec.StderrTail) <= 4<<10 && strings.Contains(rec.StderrTail, "log line 8"))
			}},
		{name: "one 100 MB line on stdout", program: lineStdout, outcome: event.OutcomeOK, result: 1 << 20, truncated: true, memoryMB: 150, floor: true},
		{name: "one 100 MB line on stderr", program: lineStderr, outcome: event.OutcomeError, result: -1, memoryMB: 150,
			check: func(t *testing.T, sc *scenario, rec *event.ToolFinished) {
				sc.truth("stderr tail kept", "≤ 4 KiB", byteCount(len(rec.StderrTail)), len(rec.StderrTail) <= 4<<10)
				sc.truth("error message", "the last log line", firstLine(rec.Result), strings.Contains(rec.Result, "failed after a long line"))
			}},
		{name: "non-UTF-8 bytes and NULs", program: badBytes, outcome: event.OutcomeOK, result: -1, progress: 2, memoryMB: 150,
			check: func(t *testing.T, sc *scenario, rec *event.ToolFinished) {
				// Each run of invalid bytes becomes one U+FFFD; a NUL is a
				// character, kept.
				sc.truth("result", "invalid bytes replaced, NUL kept", fmt.Sprintf("%q", toolOutput(rec.Result)), toolOutput(rec.Result) == "ok \uFFFD\x00 nul \uFFFD( end")
				sc.truth("stderr tail", "the same", fmt.Sprintf("%q", rec.StderrTail),
					utf8.ValidString(rec.StderrTail) && rec.StderrTail == "log \uFFFD\x00 bad \uFFFD\nlast \uFFFD\n")
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc := begin(t, tc.name, "timebox run --json")
			a := newAgent(t, scriptAgent("", "", "{name: out, description: Writes., exec: [./out.sh], timeout: 60s}"),
				[]string{callTools("out"), `{"text": "done"}`}, map[string]string{"out.sh": tc.program})
			p := startTimebox(t, a.dir, nil, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
			if code := p.wait(90 * time.Second); code != 0 {
				t.Fatalf("exit %d\n%s", code, p.stderr.String())
			}
			seen := p.log.snapshot()
			rec := p.theCall(t)
			sc.is("outcome", string(rec.Outcome), string(tc.outcome))
			call := time.Duration(rec.DurationMS) * time.Millisecond
			sc.within("call duration", call, 30*time.Second)
			if tc.floor {
				floor := pipedFloor(t, a.dir, "./out.sh")
				sc.ratio(fmt.Sprintf("call against the program piped to cat (%s)", ms(floor)), float64(call)/float64(floor), 3)
			}
			if tc.result >= 0 {
				kept := toolOutput(rec.Result)
				sc.truth("result kept", byteCount(tc.result)+truncatedNote(tc.truncated), byteCount(len(kept))+truncatedNote(rec.Truncated),
					len(kept) == tc.result && rec.Truncated == tc.truncated)
			}
			if tc.progress > 0 {
				sc.count("progress_count", rec.ProgressCount, tc.progress)
			}
			if tc.check != nil {
				tc.check(t, sc, rec)
			}
			sc.nothingLeft(p.pid())
			st, evs := stored(t, a.db, "")
			sc.records(seen, st, evs)
			sc.memory("peak memory of timebox", p.peak(), tc.memoryMB)
		})
	}
}

func byteCount(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func truncatedNote(t bool) string {
	if t {
		return ", truncated"
	}
	return ""
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// pipedFloor returns how long program takes with its stdout and stderr
// piped to cat, which throws them away: what any reader of its output
// costs it at least.
func pipedFloor(t *testing.T, dir, program string) time.Duration {
	t.Helper()
	cmd := exec.Command("bash", "-c", program+" </dev/null 2>&1 | cat >/dev/null")
	cmd.Dir = dir
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s alone: %v %s", program, err, out)
	}
	return time.Since(start)
}
