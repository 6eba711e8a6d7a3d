//go:build !windows

package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
)

// TestTemporalLostCallTraced: a turn on Temporal, traced to a real OTLP
// receiver by the runner and by each worker; the worker running two tools
// is killed with SIGKILL and another takes the turn on: the call of slow
// is lost, the call of again (retries: 1) is run again. The span the dead
// worker began for the call died with it, so the worker that records the
// call lost gives it a span of its own: under the turn's, ending where
// its last heartbeat did, error.type interrupted, phase worker_lost — not
// no span at all, which reads as a call that never ran. The next step's
// model call is traced by the second worker, in the same trace. What the
// real store holds then draws as it should: `runs show --timeline` says
// the call was lost and the other run again, and `stats` leaves the lost
// call out of its figures.
func TestTemporalLostCallTraced(t *testing.T) {
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	recv := testenv.NewOTLP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", recv.URL+"/v1/traces")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "slow"}, {"name": "again"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`name: lost-traced
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms, turn: 2m}
tools:
  - name: slow
    exec: [sh, -c, 'echo $$ >> %s; sleep 30; echo slow']
    timeout: 1m
  - name: again
    exec: [sh, -c, 'echo $$ >> %s.again; sleep 2; echo again']
    timeout: 1m
    retries: 1
`, pidfile, pidfile)), 0o644)
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", "tq-lost-traced"}
	worker := append([]string{"--worker-heartbeat", "1s"}, common...)
	var errA, errB, runErr syncbuf.Buffer
	workerA := startWorker(t, bin, worker, &errA)
	run := exec.Command(bin, append(append([]string{"run", "--engine", "temporal", "--json"}, common...), "go")...)
	var out syncbuf.Buffer
	run.Stderr, run.Stdout = &runErr, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	waitPid(t, pidfile, 1, func() string { return errA.String() + runErr.String() })
	waitPid(t, pidfile+".again", 1, func() string { return errA.String() + runErr.String() })
	// The run streams what the store has: the kill must come once the
	// call's tool_started is stored, or nothing is known of its first
	// attempt (a killed worker loses what it had not stored yet).
	wait.For(t, 20*time.Second, "again's tool_started stored", func() bool {
		for line := range strings.Lines(out.String()) {
			var e event.Event
			if json.Unmarshal([]byte(line), &e) == nil {
				if d, ok := e.Data.(*event.ToolStarted); ok && d.Tool == "again" {
					return true
				}
			}
		}
		return false
	})
	workerA.Process.Signal(syscall.SIGKILL)
	workerA.Wait()
	workerB := startWorker(t, bin, worker, &errB)
	if err := run.Wait(); err != nil {
		t.Fatalf("run: %v\n%s\nB: %s", err, runErr.String(), errB.String())
	}
	// The second worker exports what it still holds as it stops.
	workerB.Process.Signal(syscall.SIGTERM)
	workerB.Wait()

	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused: %v", bad)
	}
	spans := recv.ByName()
	turns := spans["invoke_agent lost-traced"]
	if len(turns) != 1 {
		t.Fatalf("%d turn spans; all: %v", len(turns), names(spans))
	}
	turn := turns[0]
	child := func(s *tracepb.Span) bool {
		return string(s.GetTraceId()) == string(turn.GetTraceId()) && string(s.GetParentSpanId()) == string(turn.GetSpanId())
	}
	var lost *tracepb.Span
	for _, s := range spans["execute_tool slow"] {
		if testenv.SpanAttrs(s)["timebox.phase"].GetStringValue() == "worker_lost" {
			lost = s
		}
	}
	if lost == nil {
		t.Fatalf("no span says the call of slow was lost with its worker; all: %v", names(spans))
	}
	a := testenv.SpanAttrs(lost)
	if !child(lost) || a["error.type"].GetStringValue() != "interrupted" || a["timebox.outcome"].GetStringValue() != "interrupted" ||
		a["gen_ai.tool.call.id"].GetStringValue() != "call_1_1" || a["timebox.budget.ms"].GetIntValue() != 60000 ||
		lost.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || !strings.Contains(lost.GetStatus().GetMessage(), "worker_lost") {
		t.Errorf("the lost call's span: child of the turn's %v, attributes %v, status %v", child(lost), a, lost.GetStatus())
	}
	// It runs as the record says the call is known to have run.
	var rec *event.ToolCall
	var turnID string
	for line := range strings.Lines(out.String()) {
		var e event.Event
		if json.Unmarshal([]byte(line), &e) == nil {
			turnID = e.TurnID
			if d, ok := e.Data.(*event.ToolFinished); ok && d.Tool == "slow" {
				rec = &d.ToolCall
			}
		}
	}
	if rec == nil || rec.Phase != budget.PhaseWorkerLost {
		t.Fatalf("the call's record: %+v", rec)
	}
	if start, end := int64(lost.GetStartTimeUnixNano()), int64(lost.GetEndTimeUnixNano()); start != rec.StartedAt.UnixNano() || end != rec.EndedAt.UnixNano() {
		t.Errorf("the lost call's span runs from %d to %d; its record from %s to %s", start, end, rec.StartedAt, rec.EndedAt)
	}
	if ok := spans["execute_tool again"]; len(ok) != 1 || testenv.SpanAttrs(ok[0])["timebox.outcome"].GetStringValue() != "ok" || !child(ok[0]) {
		t.Errorf("the call run again: spans %v; want one, ok, under the turn's", ok)
	}
	step2 := 0
	for _, s := range spans["chat m"] {
		if testenv.SpanAttrs(s)["timebox.step"].GetIntValue() == 2 && child(s) {
			step2++
		}
	}
	if step2 != 1 {
		t.Errorf("%d spans of step 2's model call under the turn's, want 1 (from the second worker); all: %v", step2, names(spans))
	}

	// The timeline of the stored turn.
	tl, err := exec.Command(bin, "runs", "show", turnID, "--timeline", "--db", dsn).CombinedOutput()
	if err != nil {
		t.Fatalf("runs show --timeline: %v\n%s", err, tl)
	}
	t.Logf("the stored turn:\n%s", tl)
	rows := map[string]string{}
	for line := range strings.Lines(string(tl)) {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = line
		}
	}
	if r := rows["slow"]; !strings.Contains(r, "worker lost") || !strings.Contains(r, "?") {
		t.Errorf("the lost call's row: %q\n%s", r, tl)
	}
	if r := rows["again"]; !strings.Contains(r, "ok, run again") || !strings.Contains(r, "__") {
		t.Errorf("the call run again: %q; want its lost attempt marked (__) and its words\n%s", r, tl)
	}
	if n := strings.Count(string(tl), "\nagain "); n != 1 {
		t.Errorf("the call run again has %d rows, want 1\n%s", n, tl)
	}
	// stats: the lost call is counted, and left out of the figures.
	js, err := exec.Command(bin, "stats", "--json", "--db", dsn, "--since", "all", "-f", file).Output()
	if err != nil {
		t.Fatalf("stats: %v\n%s", err, js)
	}
	var report struct {
		Tools []struct {
			Tool        string `json:"tool"`
			Calls       int64  `json:"calls"`
			Sample      int64  `json:"sample"`
			Interrupted int64  `json:"interrupted"`
			MaxMS       int64  `json:"max_ms"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(js, &report); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, js)
	}
	for _, l := range report.Tools {
		switch l.Tool {
		case "slow":
			if l.Calls != 1 || l.Sample != 0 || l.Interrupted != 1 || l.MaxMS != 0 {
				t.Errorf("stats of the lost call: %+v; want one call, interrupted, out of the sample", l)
			}
		case "again":
			if l.Calls != 1 || l.Sample != 1 || l.Interrupted != 0 || l.MaxMS < 2000 || l.MaxMS > 5000 {
				t.Errorf("stats of the call run again: %+v; want one call of about 2s", l)
			}
		}
	}
}

func names(spans map[string][]*tracepb.Span) map[string]int {
	m := map[string]int{}
	for n, ss := range spans {
		m[n] = len(ss)
	}
	return m
}
