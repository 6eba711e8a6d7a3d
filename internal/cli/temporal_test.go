//go:build !windows

package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
)

// TestTemporalWorkerKilledMidTool is the scenario, as a new user
// would try it: a dev server, PostgreSQL and one `timebox worker`; `timebox
// run --engine temporal` on an agent whose first step calls a quick tool
// and a tool hung past its 1s timeout, and whose second step calls a
// slower tool. The hung call ends timed_out in about 1s; while the slower
// tool runs the worker is killed with SIGKILL and a second one started:
// the turn answers, the slower call is reported lost (not run again), a
// call of a tool that declares retries: 1 runs again on the second worker,
// and the quick tool ran exactly once.
func TestTemporalWorkerKilledMidTool(t *testing.T) {
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	script := `{"tool_calls": [{"name": "quick"}, {"name": "hung"}]}
{"tool_calls": [{"name": "slow"}, {"name": "again"}]}
{"text": "All done."}
`
	agentYAML := fmt.Sprintf(`name: on-temporal
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms, turn: 2m}
tools:
  - name: quick
    exec: [sh, -c, 'echo run >> %[1]s/quick.count; echo quick']
    timeout: 5s
  - name: hung
    exec: [sleep, "30"]
    timeout: 1s
  - name: slow
    exec: [sh, -c, 'echo $$ >> %[2]s; sleep 30; echo slow']
    timeout: 1m
  - name: again
    exec: [sh, -c, 'echo $$ >> %[1]s/again.pids; sleep 2; echo again']
    timeout: 1m
    retries: 1
`, dir, pidfile)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(script), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(agentYAML), 0o644)
	queue := "tq-killed"
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", queue}

	var errA, errB syncbuf.Buffer
	workerA := startWorker(t, bin, append(common, "--worker-heartbeat", "1s"), &errA)

	run := exec.Command(bin, append([]string{"run", "--engine", "temporal", "--json"}, append(common, "go")...)...)
	var runErr syncbuf.Buffer
	run.Stderr = &runErr
	out, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	events := make(chan event.Event, 1000)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e event.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				events <- e
			}
		}
	}()

	slowPid := waitPid(t, pidfile, 1, func() string { return errA.String() + runErr.String() })
	waitPid(t, filepath.Join(dir, "again.pids"), 1, func() string { return errA.String() + runErr.String() })
	killedAt := time.Now()
	workerA.Process.Signal(syscall.SIGKILL)
	workerA.Wait()
	startWorker(t, bin, append(common, "--worker-heartbeat", "1s"), &errB)

	var (
		finished *event.TurnFinished
		calls    = map[string]event.ToolCall{}
	)
	timeout := time.After(90 * time.Second)
	for finished == nil {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("run ended without turn_finished\nrun: %s\nA: %s\nB: %s", runErr.String(), errA.String(), errB.String())
			}
			switch d := e.Data.(type) {
			case *event.ToolFinished:
				calls[d.Tool] = d.ToolCall
				if d.Tool == "slow" {
					t.Logf("the lost call was recorded %v after the worker was killed", time.Since(killedAt).Round(time.Millisecond))
				}
			case *event.LLMStarted:
				if d.Step == 3 {
					t.Logf("the turn's next step started on the second worker %v after the first was killed", time.Since(killedAt).Round(time.Millisecond))
				}
			case *event.TurnFinished:
				finished = d
			}
		case <-timeout:
			t.Fatalf("no turn_finished within 90s\nrun: %s\nA: %s\nB: %s", runErr.String(), errA.String(), errB.String())
		}
	}
	t.Logf("turn continued and ended %v after the worker was killed", time.Since(killedAt).Round(time.Millisecond))
	if err := run.Wait(); err != nil {
		t.Errorf("run exited with %v (want 0: the turn answered)\n%s", err, runErr.String())
	}
	if finished.Status != budget.StatusCompleted || finished.Answer != "All done." {
		t.Fatalf("turn ended %s (%s): %s\nB: %s", finished.Status, finished.StopReason, finished.Message, errB.String())
	}
	if h := calls["hung"]; h.Outcome != event.OutcomeTimedOut || h.DurationMS < 1000 || h.DurationMS > 3000 {
		t.Errorf("hung call: %s after %dms, want timed_out in about 1s", h.Outcome, h.DurationMS)
	}
	slow := calls["slow"]
	if slow.Outcome != event.OutcomeInterrupted || !strings.Contains(slow.Result, "worker_lost") {
		t.Errorf("slow call: outcome %s, result %s; want interrupted, reported to the model as worker_lost", slow.Outcome, slow.Result)
	}
	// It names the worker (Temporal's heartbeat timeout does not).
	if !strings.Contains(slow.Result, fmt.Sprintf("its worker (pid %d on ", workerA.Process.Pid)) {
		t.Errorf("slow call's result does not name its worker (pid %d): %s", workerA.Process.Pid, slow.Result)
	}
	// A tool that declares retries runs again on the other worker.
	// What the tool printed, then the time the model is told it took.
	if a := calls["again"]; a.Outcome != event.OutcomeOK || !strings.HasPrefix(a.Result, "again\n[timebox: took ") {
		t.Errorf("again call: outcome %s, result %q; want ok, run again after its worker died (retries: 1)", a.Outcome, a.Result)
	}
	if n := len(strings.Fields(readFile(filepath.Join(dir, "again.pids")))); n != 2 {
		t.Errorf("the tool with retries: 1 was started %d times, want 2", n)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "quick.count")); strings.Count(string(b), "run") != 1 {
		t.Errorf("the quick tool ran %d times, want 1", strings.Count(string(b), "run"))
	}
	if n := len(strings.Fields(readFile(pidfile))); n != 1 {
		t.Errorf("the slow tool was started %d times, want 1 (a lost call is never run again)", n)
	}
	// The killed worker's tool was stopped: by its parent-death signal, or
	// by the second worker reaping what the dead one left.
	pid, _ := strconv.Atoi(slowPid)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the killed worker's tool (pid %d) is still running", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startWorker starts `timebox worker` and waits until it says it runs.
func startWorker(t *testing.T, bin string, args []string, errb *syncbuf.Buffer) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"worker"}, args...)...)
	cmd.Stderr = errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "timebox worker running") {
			return cmd
		}
	}
	t.Fatalf("the worker did not start: %s", errb.String())
	return nil
}

// TestTemporalRunnerFlags is issue 22's scenario: `run --engine temporal
// --turn-timeout 20s --tool-timeout 1s` runs the turn with those budgets,
// sourced flag, though the worker was started without them.
func TestTemporalRunnerFlags(t *testing.T) {
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "sleepy"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: flags\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntimeouts: {kill_grace: 200ms}\n"+
		"tools:\n  - name: sleepy\n    exec: [sleep, \"30\"]\n"), 0o644)
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", "tq-flags"}
	var werr syncbuf.Buffer
	startWorker(t, bin, common, &werr)
	out, err := exec.Command(bin, append(append([]string{"run", "--engine", "temporal", "--json", "--turn-timeout", "20s", "--tool-timeout", "1s"}, common...), "go")...).Output()
	if err != nil {
		t.Fatalf("run: %v\n%s\nworker: %s", err, out, werr.String())
	}
	var started *event.TurnStarted
	var call *event.ToolFinished
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event.Event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			started = d
		case *event.ToolFinished:
			call = d
		}
	}
	if started == nil || call == nil {
		t.Fatalf("no turn_started or tool_finished in:\n%s", out)
	}
	if b := started.Budgets["timeouts.turn"]; b.MS != 20000 || b.Source != budget.SourceFlag {
		t.Errorf("the turn's budget: %+v; want 20s from the flag", b)
	}
	if call.Outcome != event.OutcomeTimedOut || call.TimeoutMS != 1000 || call.TimeoutSource != budget.SourceFlag || call.DurationMS > 3000 {
		t.Errorf("the call: %s after %dms, timeout %dms from %s; want timed_out at 1s, from the flag", call.Outcome, call.DurationMS, call.TimeoutMS, call.TimeoutSource)
	}
}

// TestTemporalWorkerStalledMidTool: a worker stopped (SIGSTOP) past its
// heartbeat timeout while two calls run, then let go on: Temporal has
// given its attempts up, so what they report when it comes back is not
// the turn's. The call of a tool without retries is recorded lost
// (interrupted, worker_lost) and the one with retries: 1 runs again,
// its result the model's. (Both were recorded "cancelled" by the stalled
// worker, and the retry's result refused.)
func TestTemporalWorkerStalledMidTool(t *testing.T) {
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	script := `{"tool_calls": [{"name": "idem"}, {"name": "once"}]}
{"text": "Done with both."}
`
	agentYAML := fmt.Sprintf(`name: stalled
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms, turn: 2m}
tools:
  - name: idem
    exec: [sh, -c, 'echo $$ >> %[1]s/idem.pids; sleep 6; echo idem']
    timeout: 1m
    retries: 1
  - name: once
    exec: [sh, -c, 'echo $$ >> %[1]s/once.pids; sleep 6; echo once']
    timeout: 1m
`, dir)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(script), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(agentYAML), 0o644)
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", "tq-stalled"}
	var errA, errB, runErr syncbuf.Buffer
	workerA := startWorker(t, bin, append(common, "--worker-heartbeat", "1s"), &errA)
	run := exec.Command(bin, append([]string{"run", "--engine", "temporal", "--json"}, append(common, "go")...)...)
	run.Stderr = &runErr
	var out syncbuf.Buffer
	run.Stdout = &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	logs := func() string { return errA.String() + runErr.String() }
	waitPid(t, filepath.Join(dir, "idem.pids"), 1, logs)
	waitPid(t, filepath.Join(dir, "once.pids"), 1, logs)
	workerA.Process.Signal(syscall.SIGSTOP)
	startWorker(t, bin, append(common, "--worker-heartbeat", "1s"), &errB)
	time.Sleep(3500 * time.Millisecond) // the stall: past the 1s heartbeat timeout
	workerA.Process.Signal(syscall.SIGCONT)
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run exited with %v\n%s", err, runErr.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("the turn did not end\nrun: %s\nA: %s\nB: %s", runErr.String(), errA.String(), errB.String())
	}
	calls := map[string]event.ToolCall{}
	for line := range strings.Lines(out.String()) {
		var e event.Event
		if json.Unmarshal([]byte(line), &e) == nil {
			if d, ok := e.Data.(*event.ToolFinished); ok {
				calls[d.Tool] = d.ToolCall
			}
		}
	}
	if c := calls["once"]; c.Outcome != event.OutcomeInterrupted || c.Phase != budget.PhaseWorkerLost {
		t.Errorf("once: %s/%s (%s); want interrupted/worker_lost", c.Outcome, c.Phase, c.Result)
	}
	// The retry runs where Temporal sends it: often on the other worker,
	// to the result; sometimes to the stalled worker's poll sent before
	// the stall, where it is lost in turn. Either way it is never the
	// stalled attempt's "cancelled".
	switch c := calls["idem"]; {
	case c.Outcome == event.OutcomeOK && strings.HasPrefix(c.Result, "idem\n"):
	case c.Outcome == event.OutcomeInterrupted && c.Phase == budget.PhaseWorkerLost:
		t.Logf("idem's retry was lost too (sent to the stalled worker's poll)")
	default:
		t.Errorf("idem: %s/%s (%s); want ok (run again) or interrupted/worker_lost", c.Outcome, c.Phase, c.Result)
	}
}

// TestTemporalCeilingWhileTheWorkerIsDead: the turn's ceiling falls while
// its tool's worker is dead: the turn ends as on the embedded engine,
// saying the tool was running and flagged timed_out_during_tool_execution
// (it said "Last step: model m", without the flag).
func TestTemporalCeilingWhileTheWorkerIsDead(t *testing.T) {
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "work"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`name: ceiling
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms, turn: 3s}
tools:
  - name: work
    exec: [sh, -c, 'echo $$ >> %s/work.pids; sleep 20; echo work']
    timeout: 30s
`, dir)), 0o644)
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", "tq-ceiling-dead"}
	var errA, errB, runErr, out syncbuf.Buffer
	workerA := startWorker(t, bin, append(common, "--worker-heartbeat", "5s"), &errA)
	run := exec.Command(bin, append([]string{"run", "--engine", "temporal", "--json"}, append(common, "go")...)...)
	run.Stderr, run.Stdout = &runErr, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	waitPid(t, filepath.Join(dir, "work.pids"), 1, func() string { return errA.String() + runErr.String() })
	workerA.Process.Signal(syscall.SIGKILL)
	workerA.Wait()
	startWorker(t, bin, append(common, "--worker-heartbeat", "5s"), &errB)
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the turn did not end\n%s", runErr.String())
	}
	var fin *event.TurnFinished
	for line := range strings.Lines(out.String()) {
		var e event.Event
		if json.Unmarshal([]byte(line), &e) == nil {
			if d, ok := e.Data.(*event.TurnFinished); ok {
				fin = d
			}
		}
	}
	if fin == nil {
		t.Fatalf("no turn_finished\n%s", runErr.String())
	}
	if fin.StopReason != budget.TurnTimeout || !strings.Contains(fin.Message, "Last step: tool work, running for ") ||
		!fin.Flags.TimedOutDuringToolExecution || !fin.Flags.TimedOutByTurnBudget {
		t.Errorf("turn ended %s with flags %+v: %s", fin.StopReason, fin.Flags, fin.Message)
	}
	// It ran until the ceiling fell, not until the workflow heard of the
	// loss, a heartbeat timeout and a workflow task later (it said
	// "running for 8s" of a turn stopped after 3s).
	_, after, _ := strings.Cut(fin.Message, "running for ")
	if ran, err := time.ParseDuration(strings.TrimSuffix(strings.SplitN(after, " ", 2)[0], ".")); err != nil || ran > 3*time.Second {
		t.Errorf("the tool ran longer than the turn, or for no time said: %s", fin.Message)
	}
}
