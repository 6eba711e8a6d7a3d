//go:build linux

package exectool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
	"github.com/timebox-run/timebox/tool/runas"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		// syscall.Exit, not os.Exit: under -race, os.Exit sleeps a second
		// (GORACE atexit_sleep_ms) before exiting, which would make every
		// helper a second slower.
		syscall.Exit(helper(os.Args[2:]))
	}
	// proctree.Close removes the idle cgroups now rather than leave them
	// for the next process to clean up.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { proctree.Close(); os.Exit(code) }))
}

// forEachStrategy runs f once per process-tree strategy, with the leak
// check after each. The cgroup strategy is skipped, saying why, where this
// machine cannot use it.
func forEachStrategy(t *testing.T, f func(t *testing.T, s proctree.Strategy)) {
	t.Helper()
	for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track} {
		t.Run(string(s), func(t *testing.T) {
			if _, err := proctree.Resolve(s); err != nil {
				t.Skip(err)
			}
			proctest.AfterTest(t)
			f(t, s)
		})
	}
}

func newTool(t testing.TB, s proctree.Strategy, mode string, args ...string) *exectool.Tool {
	t.Helper()
	return newToolCfg(t, exectool.Config{ProcTree: s}, mode, args...)
}

func newToolCfg(t testing.TB, cfg exectool.Config, mode string, args ...string) *exectool.Tool {
	t.Helper()
	cfg.Spec = tool.Spec{Name: "helper"}
	cfg.Argv = append([]string{self(), helperArg, mode}, args...)
	tl, err := exectool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func hard(timeout, grace time.Duration) budget.ToolBudget {
	return budget.ToolBudget{
		Timeout:     budget.Duration{D: timeout, Source: budget.SourceTool, Knob: "tools[helper].timeout in agent.yaml"},
		Enforcement: budget.Hard, KillGrace: budget.Duration{D: grace}}
}

// call runs one call through the runner, as the turn loop does.
func call(t *testing.T, tl tool.Tool, b budget.ToolBudget, h tool.Hooks) *tool.Execution {
	t.Helper()
	return tool.Run(t.Context(), tl, &tool.Call{ID: "c1", Tool: "helper", Input: json.RawMessage(`{"q": 1}`)}, b, h)
}

// childPIDs returns the pids a helper printed as "child N" lines.
func childPIDs(t *testing.T, out []byte) []int {
	t.Helper()
	var pids []int
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "child "); ok {
			pid, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("bad child line %q", line)
			}
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		t.Fatalf("the helper reported no child (output %q)", out)
	}
	return pids
}

// alive reports whether pid is a process that has not exited. A zombie
// (exited, waiting for a parent that does not reap) is not alive.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// assertGone fails if any pid is alive. It does not wait: when a call has
// returned, its whole tree must already be gone.
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d outlived its call", pid)
		}
	}
}

func TestSuccess(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		for _, tc := range []struct{ mode, want string }{
			{"plain", "hello, world\n"},
			{"json", `{"ok": true, "n": 3}`},
		} {
			x := call(t, newTool(t, s, tc.mode), hard(10*time.Second, time.Second), tool.Hooks{})
			if x.Outcome != event.OutcomeOK || x.Err != nil {
				t.Fatalf("%s: outcome %s, err %v", tc.mode, x.Outcome, x.Err)
			}
			if got := string(x.Result.Output); got != tc.want {
				t.Errorf("%s: output %q, want %q", tc.mode, got, tc.want)
			}
			if x.Result.ExitCode == nil || *x.Result.ExitCode != 0 || x.Result.Truncated {
				t.Errorf("%s: exit code %v, truncated %v", tc.mode, x.Result.ExitCode, x.Result.Truncated)
			}
		}
	})
}

func TestStdinProtocol(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl := newTool(t, s, "echo-stdin")
		deadline := time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC)
		res, err := tl.Call(t.Context(), &tool.Call{ID: "call-7", Tool: "fetch", Input: json.RawMessage(`{"url": "https://example.org"}`),
			Deadline: deadline, Timeout: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(res.Output, []byte("}\n")) || bytes.Count(res.Output, []byte("\n")) != 1 {
			t.Errorf("stdin is not one JSON object and a newline: %q", res.Output)
		}
		var got map[string]any
		if err := json.Unmarshal(res.Output, &got); err != nil {
			t.Fatalf("stdin is not JSON: %v: %q", err, res.Output)
		}
		want := map[string]any{"tool": "fetch", "call_id": "call-7", "input": map[string]any{"url": "https://example.org"},
			"deadline": "2030-01-02T03:04:05.123456789Z", "timeout_ms": 1500.0}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("stdin\n got %v\nwant %v", got, want)
		}

		// No deadline: the fields are left out; no input: an empty object.
		res, err = tl.Call(t.Context(), &tool.Call{ID: "call-8"})
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		json.Unmarshal(res.Output, &got)
		want = map[string]any{"tool": "helper", "call_id": "call-8", "input": map[string]any{}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("stdin without deadline\n got %v\nwant %v", got, want)
		}

		// A program that never reads stdin is not held up by a request
		// larger than the pipe.
		big := json.RawMessage(`{"text": "` + strings.Repeat("x", 1<<20) + `"}`)
		res, err = newTool(t, s, "plain").Call(t.Context(), &tool.Call{ID: "call-9", Input: big})
		if err != nil || string(res.Output) != "hello, world\n" {
			t.Errorf("unread stdin: %q %v", res.Output, err)
		}
	})
}

// reportList is a tool.Progress that keeps every report, as the tool made
// them (tool.Run would coalesce them).
type reportList struct {
	mu      sync.Mutex
	reports []tool.Report
}

func (l *reportList) Report(r tool.Report) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reports = append(l.reports, r)
}

func TestProgress(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		// Through the runner: every report counted, the last one passed on.
		var last tool.Report
		x := call(t, newTool(t, s, "progress"), hard(10*time.Second, time.Second), tool.Hooks{OnProgress: func(r tool.Report) { last = r }})
		if x.Outcome != event.OutcomeOK {
			t.Fatalf("outcome %s: %v", x.Outcome, x.Err)
		}
		if x.Progress != 5 || last.Message != `{"progress": "two", oops` {
			t.Fatalf("progress count %d, last report %+v", x.Progress, last)
		}
		// Each line as the tool wrote it.
		var l reportList
		res, err := newTool(t, s, "progress").Call(t.Context(), &tool.Call{ID: "c1", Tool: "helper", Progress: &l})
		if err != nil || string(res.Output) != "done" {
			t.Fatalf("call: %q %v", res.Output, err)
		}
		reports := l.reports
		if len(reports) != 5 {
			t.Fatalf("%d reports, want 5: %+v", len(reports), reports)
		}
		f := func(v float64) *float64 { return &v }
		want := []tool.Report{
			{Progress: f(1), Total: f(3), Message: "one"},
			{Progress: f(2), Total: f(3)},
			{},
			{Message: "fetching page 3"},
			{Message: `{"progress": "two", oops`}, // malformed JSON: the raw text
		}
		for i := range want {
			if fmt.Sprint(deref(reports[i])) != fmt.Sprint(deref(want[i])) {
				t.Errorf("report %d: %v, want %v", i, deref(reports[i]), deref(want[i]))
			}
		}
		if tail := res.StderrTail; tail != "log line a\nlog line b" {
			t.Errorf("stderr tail %q, want the log lines without the progress lines", tail)
		}
	})
}

func deref(r tool.Report) [3]any {
	v := [3]any{nil, nil, r.Message}
	if r.Progress != nil {
		v[0] = *r.Progress
	}
	if r.Total != nil {
		v[1] = *r.Total
	}
	return v
}

func TestExitError(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		x := call(t, newTool(t, s, "fail"), hard(10*time.Second, time.Second), tool.Hooks{})
		if x.Outcome != event.OutcomeError {
			t.Fatalf("outcome %s, want error", x.Outcome)
		}
		var te *tool.Error
		if !errors.As(x.Err, &te) {
			t.Fatalf("error %T %v is not a *tool.Error", x.Err, x.Err)
		}
		if te.ExitCode == nil || *te.ExitCode != 3 {
			t.Errorf("exit code %v, want 3", te.ExitCode)
		}
		if got, want := te.Error(), "exit status 3: boom: connection refused"; got != want {
			t.Errorf("error %q, want %q", got, want)
		}
		if te.StderrTail != "starting\nboom: connection refused\n" || x.Result.StderrTail != te.StderrTail {
			t.Errorf("stderr tail %q / %q", te.StderrTail, x.Result.StderrTail)
		}
		if string(x.Result.Output) != "partial" || x.Result.ExitCode == nil || *x.Result.ExitCode != 3 {
			t.Errorf("result %q exit %v, want the partial output and code 3", x.Result.Output, x.Result.ExitCode)
		}
		msg := tool.ModelResult("helper", hard(10*time.Second, time.Second), x)
		if !strings.Contains(msg, `"type":"tool_error"`) || !strings.Contains(msg, "connection refused") {
			t.Errorf("model result %s", msg)
		}
	})
}

func TestKilledBySignal(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		res, err := newTool(t, s, "sigkill").Call(t.Context(), &tool.Call{ID: "c"})
		var te *tool.Error
		if !errors.As(err, &te) {
			t.Fatalf("error %T %v is not a *tool.Error", err, err)
		}
		if te.ExitCode != nil || res.ExitCode != nil {
			t.Errorf("exit code %v, want none for a signal", te.ExitCode)
		}
		if te.Message != "killed by SIGKILL: about to die" {
			t.Errorf("message %q", te.Message)
		}
	})
}

func TestCannotStart(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec.sh")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		for _, tc := range []struct {
			argv []string
			want string
		}{
			{[]string{"/nonexistent/tool"}, "cannot start /nonexistent/tool: no such file"},
			{[]string{"timebox-no-such-program"}, "cannot start timebox-no-such-program: no such program in PATH"},
			{[]string{noexec}, "permission denied"},
		} {
			tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "x"}, Argv: tc.argv, ProcTree: s})
			if err != nil {
				t.Fatal(err)
			}
			x := call(t, tl, hard(10*time.Second, time.Second), tool.Hooks{})
			var te *tool.Error
			if x.Outcome != event.OutcomeError || !errors.As(x.Err, &te) {
				t.Fatalf("%v: outcome %s, error %T %v", tc.argv, x.Outcome, x.Err, x.Err)
			}
			if !strings.Contains(te.Message, tc.want) {
				t.Errorf("%v: message %q, want it to contain %q", tc.argv, te.Message, tc.want)
			}
		}
	})
}

func TestOutputCap(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		// 64 MiB through a 1000-byte cap: the call completes (the program
		// was never blocked on a full pipe) and keeps the first 1000 bytes.
		tl := newTool(t, s, "big", strconv.Itoa(64<<20))
		c := &tool.Call{ID: "c1", MaxOutput: 1000}
		x := tool.Run(t.Context(), tl, c, hard(20*time.Second, time.Second), tool.Hooks{})
		if x.Outcome != event.OutcomeOK {
			t.Fatalf("outcome %s: %v", x.Outcome, x.Err)
		}
		if len(x.Result.Output) != 1000 || !x.Result.Truncated {
			t.Errorf("kept %d bytes, truncated %v; want 1000, true", len(x.Result.Output), x.Result.Truncated)
		}

		// The tool's own cap applies when the call sets none.
		tl = newToolCfg(t, exectool.Config{ProcTree: s, MaxOutput: 10}, "plain")
		res, err := tl.Call(t.Context(), &tool.Call{ID: "c2"})
		if err != nil || string(res.Output) != "hello, wor" || !res.Truncated {
			t.Errorf("output %q truncated %v err %v", res.Output, res.Truncated, err)
		}
	})
}

// TestPartialOutputIsTheEnd: a failed or stopped call's partial_output
// is the end of what the tool wrote, past the cap too, and says when it is
// not all of it; the record keeps the output's start. (It was the end of
// the kept start: a tool's last lines, often what explains its failure,
// never reached the model.)
func TestPartialOutputIsTheEnd(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		for _, tc := range []struct {
			name, script string
			outcome      event.Outcome
		}{
			{"failed", "seq 1 100000; echo FINAL; exit 1", event.OutcomeError},
			{"stopped", "seq 1 100000; echo FINAL; exec sleep 100", event.OutcomeTimedOut},
		} {
			tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "helper"}, Argv: []string{"/bin/sh", "-c", tc.script}, ProcTree: s})
			if err != nil {
				t.Fatal(err)
			}
			b := hard(time.Second, 100*time.Millisecond)
			x := tool.Run(t.Context(), tl, &tool.Call{ID: "c1", Tool: "helper", MaxOutput: 4096}, b, tool.Hooks{})
			if x.Outcome != tc.outcome {
				t.Fatalf("%s: outcome %s, want %s (%v)", tc.name, x.Outcome, tc.outcome, x.Err)
			}
			if !x.Result.Truncated || len(x.Result.Output) != 4096 || !strings.HasPrefix(string(x.Result.Output), "1\n2\n3\n") {
				t.Errorf("%s: the record's output: %d bytes, truncated %v", tc.name, len(x.Result.Output), x.Result.Truncated)
			}
			var got struct {
				Error struct {
					Partial   string `json:"partial_output"`
					Truncated bool   `json:"partial_output_truncated"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(tool.ModelResult("helper", b, x)), &got); err != nil {
				t.Fatal(err)
			}
			if p := got.Error.Partial; !strings.HasSuffix(p, "99999\n100000\nFINAL\n") || len(p) > tool.PartialBytes || !got.Error.Truncated {
				t.Errorf("%s: partial_output of %d bytes ends %q, truncated %v; want the end of what the tool wrote",
					tc.name, len(p), p[max(0, len(p)-40):], got.Error.Truncated)
			}
		}
	})
}

// TestOutputCapKeepsCharactersWhole: the cap falls inside a character; the
// output is cut before it, not in it.
func TestOutputCapKeepsCharactersWhole(t *testing.T) {
	tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "helper"},
		Argv: []string{"/bin/sh", "-c", `head -c 1023 /dev/zero | tr '\0' a; printf '\303\251 and more'`}})
	if err != nil {
		t.Fatal(err)
	}
	x := tool.Run(t.Context(), tl, &tool.Call{ID: "c1", Tool: "helper", MaxOutput: 1024}, hard(10*time.Second, time.Second), tool.Hooks{})
	if x.Outcome != event.OutcomeOK || !x.Result.Truncated || string(x.Result.Output) != strings.Repeat("a", 1023) {
		t.Errorf("outcome %s, truncated %v, output ends %q", x.Outcome, x.Result.Truncated, x.Result.Output[max(0, len(x.Result.Output)-4):])
	}
}

func TestEnvAllowlist(t *testing.T) {
	t.Setenv("TB_TEST_VISIBLE", "yes")
	t.Setenv("TB_TEST_HIDDEN", "no")
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl := newToolCfg(t, exectool.Config{ProcTree: s, Env: []string{"TB_TEST_VISIBLE", "TB_TEST_UNSET"}}, "env")
		res, err := tl.Call(t.Context(), &tool.Call{ID: "c"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, kv := range strings.Split(string(res.Output), "\n") {
			k, v, _ := strings.Cut(kv, "=")
			names = append(names, k)
			if k == proctree.EnvMarker && !strings.HasPrefix(v, proctree.Instance()+"-") {
				t.Errorf("marker %q does not start with this process's instance", v)
			}
		}
		slices.Sort(names)
		if want := []string{"TB_TEST_VISIBLE", proctree.EnvMarker}; !slices.Equal(names, want) {
			t.Errorf("environment %v, want only %v", names, want)
		}

		// nil: everything.
		res, err = newTool(t, s, "env").Call(t.Context(), &tool.Call{ID: "c"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(res.Output), "TB_TEST_HIDDEN=no") || !strings.Contains(string(res.Output), proctree.EnvMarker+"=") {
			t.Errorf("the whole environment was not passed: %q", res.Output)
		}

		// nil with Withhold: everything but timebox's secrets.
		t.Setenv("TIMEBOX_TOKEN", "s3cret")
		res, err = newToolCfg(t, exectool.Config{ProcTree: s, Withhold: []string{"TIMEBOX_TOKEN"}}, "env").Call(t.Context(), &tool.Call{ID: "c"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(res.Output), "s3cret") || !strings.Contains(string(res.Output), "TB_TEST_HIDDEN=no") {
			t.Errorf("withholding TIMEBOX_TOKEN: %q", res.Output)
		}
	})
}

// TestUser: a tool with User runs as that user, with its HOME, USER and
// LOGNAME (when timebox runs as root).
func TestUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a tool as another user needs root")
	}
	id, err := runas.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	// The test binary is the tool: a copy that nobody may run.
	dir, err := os.MkdirTemp("", "timebox-user-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin, err := os.ReadFile(self())
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "helper")
	if err := os.WriteFile(prog, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "helper"}, Argv: []string{prog, helperArg, "whoami"},
			ProcTree: s, User: id, Workdir: "/"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := tl.Call(t.Context(), &tool.Call{ID: "c"})
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("uid=%d gid=%d HOME=%s USER=%s", id.UID, id.GID, id.Home, id.Name)
		if got := string(res.Output); got != want {
			t.Errorf("the tool ran as %q, want %q", got, want)
		}
	})
}

func TestWorkdir(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		dir := t.TempDir()
		res, err := newToolCfg(t, exectool.Config{ProcTree: s, Workdir: dir}, "pwd").Call(t.Context(), &tool.Call{ID: "c"})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := filepath.EvalSymlinks(dir)
		if got, _ := filepath.EvalSymlinks(string(res.Output)); got != want {
			t.Errorf("working directory %q, want %q", res.Output, dir)
		}

		// A relative program path is relative to the working directory.
		if err := os.Symlink(self(), filepath.Join(dir, "helper")); err != nil {
			t.Fatal(err)
		}
		tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "h"}, Argv: []string{"./helper", helperArg, "plain"}, Workdir: dir, ProcTree: s})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := tl.Call(t.Context(), &tool.Call{ID: "c"}); err != nil || string(res.Output) != "hello, world\n" {
			t.Errorf("./helper in the working directory: %q %v", res.Output, err)
		}
	})
}

func TestNonUTF8(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		x := call(t, newTool(t, s, "nonutf8"), hard(10*time.Second, time.Second), tool.Hooks{})
		var te *tool.Error
		if x.Outcome != event.OutcomeError || !errors.As(x.Err, &te) {
			t.Fatalf("outcome %s err %v", x.Outcome, x.Err)
		}
		if !bytes.Equal(x.Result.Output, []byte("ok \xff\xfe\xfd end")) {
			t.Errorf("output %q: the bytes must be kept as written", x.Result.Output)
		}
		for _, s := range []string{te.Message, te.StderrTail, x.Result.StderrTail} {
			if !utf8.ValidString(s) {
				t.Errorf("%q is not valid UTF-8", s)
			}
		}
		msg := tool.ModelResult("helper", hard(10*time.Second, time.Second), x)
		if !utf8.ValidString(msg) || !json.Valid([]byte(msg)) {
			t.Errorf("model result is not valid JSON text: %q", msg)
		}
	})
}

func TestHungToolStoppedAtDeadline(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		b := hard(time.Second, 2*time.Second)
		x := call(t, newTool(t, s, "hang"), b, tool.Hooks{})
		if x.Outcome != event.OutcomeTimedOut || x.Phase != budget.PhaseTool || x.Abandoned {
			t.Fatalf("outcome %s phase %s abandoned %v, want timed_out in phase tool", x.Outcome, x.Phase, x.Abandoned)
		}
		if e := x.Elapsed(); e < time.Second || e > 2500*time.Millisecond {
			t.Errorf("elapsed %s, want 1s to 2.5s", e)
		}
		if x.Result == nil || string(x.Result.Output) != "partial" {
			t.Errorf("partial output %+v", x.Result)
		}
		if msg := tool.ModelResult("helper", b, x); !strings.Contains(msg, `"type":"tool_timeout"`) || !strings.Contains(msg, `"partial_output":"partial"`) {
			t.Errorf("model result %s", msg)
		}
	})
}

func TestIgnoresSIGTERMKilledAfterGrace(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		const grace = 300 * time.Millisecond
		x := call(t, newTool(t, s, "ignore-term"), hard(time.Second, grace), tool.Hooks{})
		if x.Progress < 1 {
			t.Fatal("the helper did not report that it ignores SIGTERM before the deadline")
		}
		if x.Outcome != event.OutcomeTimedOut || x.Abandoned {
			t.Fatalf("outcome %s abandoned %v, want timed_out", x.Outcome, x.Abandoned)
		}
		if e := x.Elapsed(); e < time.Second+grace || e > time.Second+grace+1500*time.Millisecond {
			t.Errorf("elapsed %s, want timeout+grace (1.3s) to 2.8s", e)
		}
	})
}

// TestCooperativeExecIsNeverAbandoned: an exec tool owns its processes and
// stops them whole, so a cooperative one that ignores SIGTERM is killed
// after the grace and waited for, as a hard one: timed_out, not recorded
// abandoned while it was in fact stopped.
func TestCooperativeExecIsNeverAbandoned(t *testing.T) {
	const grace = 300 * time.Millisecond
	b := hard(time.Second, grace)
	b.Enforcement = budget.Cooperative
	x := call(t, newTool(t, proctree.Auto, "ignore-term"), b, tool.Hooks{})
	if x.Outcome != event.OutcomeTimedOut || x.Abandoned {
		t.Fatalf("outcome %s abandoned %v, want timed_out", x.Outcome, x.Abandoned)
	}
	if n := tool.AbandonedRunning(); n != 0 {
		t.Errorf("%d abandoned calls running", n)
	}
}

func TestNoDescendantSurvives(t *testing.T) {
	cases := []struct {
		name string
		args []string
		// stop: the call is stopped (cancelled) once the helper reports
		// that its descendants are running; otherwise it exits by itself.
		stop    bool
		outcome event.Outcome
	}{
		{"setsid grandchild", []string{"setsid"}, true, event.OutcomeCancelled},
		{"double-forked daemon whose parent exited", []string{"daemon"}, true, event.OutcomeCancelled},
		// The same daemon left behind by a tool that exits 0: it is part
		// of the call and is killed when the call ends.
		{"daemon left by a normal exit", []string{"daemon", "exit"}, false, event.OutcomeOK},
		// A background child that holds stdout open after its parent
		// exited: the call must not wait for it.
		{"background child holding stdout", []string{"bg-stdout"}, false, event.OutcomeOK},
	}
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				var h tool.Hooks
				if tc.stop {
					h.OnProgress = func(tool.Report) { cancel(&budget.CancelError{Reason: budget.Cancelled}) }
				}
				x := tool.Run(ctx, newTool(t, s, tc.args[0], tc.args[1:]...), &tool.Call{ID: "c1"}, hard(20*time.Second, 2*time.Second), h)
				if x.Outcome != tc.outcome || x.Abandoned {
					t.Fatalf("outcome %s abandoned %v (err %v), want %s", x.Outcome, x.Abandoned, x.Err, tc.outcome)
				}
				if e := x.Elapsed(); e > 5*time.Second {
					t.Errorf("elapsed %s", e)
				}
				assertGone(t, childPIDs(t, x.Result.Output))
			})
		}
	})
}

func TestClearedEnvironmentEscapeNeedsCgroup(t *testing.T) {
	// Documented limit of tracking: a process that clears its environment
	// and leaves the process group is invisible to it. A cgroup sees it.
	if _, err := proctree.Resolve(proctree.Cgroup); err != nil {
		t.Skip(err)
	}
	proctest.AfterTest(t)
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	x := tool.Run(ctx, newTool(t, proctree.Cgroup, "clear-env-escape"), &tool.Call{ID: "c1"}, hard(20*time.Second, time.Second),
		tool.Hooks{OnProgress: func(tool.Report) { cancel(&budget.CancelError{Reason: budget.Cancelled}) }})
	if x.Outcome != event.OutcomeCancelled {
		t.Fatalf("outcome %s", x.Outcome)
	}
	assertGone(t, childPIDs(t, x.Result.Output))
}

func TestCancelUsesCancelGrace(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		var once sync.Once
		var cancelled time.Time
		// kill_grace is 3s, but a cancellation gets at most
		// budget.CancelGrace (500ms) before SIGKILL.
		b := hard(30*time.Second, 3*time.Second)
		x := tool.Run(ctx, newTool(t, s, "ignore-term"), &tool.Call{ID: "c1"}, b, tool.Hooks{OnProgress: func(tool.Report) {
			once.Do(func() {
				cancelled = time.Now()
				cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the client"})
			})
		}})
		if x.Outcome != event.OutcomeCancelled || x.Phase != budget.PhaseCancel || x.Abandoned {
			t.Fatalf("outcome %s phase %s abandoned %v", x.Outcome, x.Phase, x.Abandoned)
		}
		if cancelled.IsZero() {
			t.Fatal("never cancelled")
		}
		if d := x.Ended.Sub(cancelled); d < budget.CancelGrace || d > budget.CancelGrace+time.Second {
			t.Errorf("stopped %s after the cancellation, want %s to %s", d, budget.CancelGrace, budget.CancelGrace+time.Second)
		}
	})
}

func TestStoppedCallReturnsCause(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl := newTool(t, s, "hang")
		cause := &budget.TimeoutError{Phase: budget.PhaseTool, Limit: time.Second}
		ctx, cancel := context.WithCancelCause(t.Context())
		c := &tool.Call{ID: "c1", KillGrace: time.Second, Progress: reportFunc(func(tool.Report) { cancel(cause) })}
		res, err := tl.Call(ctx, c)
		if err != cause {
			t.Fatalf("error %T %v, want the context's cause", err, err)
		}
		var te *tool.Error
		if errors.As(err, &te) {
			t.Error("a stop must not be a *tool.Error")
		}
		if res == nil || string(res.Output) != "partial" || res.ExitCode != nil {
			t.Errorf("result %+v, want the partial output and no exit code", res)
		}

		// Done before the call starts: nothing runs.
		res, err = tl.Call(ctx, c)
		if err != cause || res != nil {
			t.Errorf("already-done context: %v %v", res, err)
		}
	})
}

type reportFunc func(tool.Report)

func (f reportFunc) Report(r tool.Report) { f(r) }

func TestConcurrentCalls(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl := newTool(t, s, "echo-stdin")
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				id := fmt.Sprintf("c%d", i)
				res, err := tl.Call(context.Background(), &tool.Call{ID: id, Input: json.RawMessage(`{}`)})
				if err != nil || !strings.Contains(string(res.Output), `"call_id":"`+id+`"`) {
					t.Errorf("%s: %v %q", id, err, res.Output)
				}
			})
		}
		wg.Wait()
	})
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  exectool.Config
		want string
	}{
		{"no argv", exectool.Config{}, "needs a program"},
		{"empty program", exectool.Config{Argv: []string{""}}, "needs a program"},
		{"bad env name", exectool.Config{Argv: []string{"x"}, Env: []string{"A=B"}}, `"A=B" is not a variable name`},
		{"negative cap", exectool.Config{Argv: []string{"x"}, MaxOutput: -1}, "negative"},
		{"bad strategy", exectool.Config{Argv: []string{"x"}, ProcTree: "magic"}, `"magic" is not a process-tree strategy`},
	} {
		if _, err := exectool.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	argv := []string{"prog", "a"}
	tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "n"}, Argv: argv})
	if err != nil {
		t.Fatal(err)
	}
	argv[0] = "changed"
	if tl.Kind() != tool.KindExec || tl.Spec().Name != "n" {
		t.Errorf("kind %s spec %+v", tl.Kind(), tl.Spec())
	}
}
