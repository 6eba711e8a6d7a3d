//go:build !windows

package cli_test

import (
	"database/sql"
	"encoding/hex"
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

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	_ "github.com/timebox-run/timebox/store/sqlite" // its driver, to see what the killed process stored
)

// TestLostTurnSpanMadeByTheNextStart: `timebox run`, traced to a real OTLP
// receiver, is killed with SIGKILL while its turn's second tool runs. The
// first call's span was exported; the turn's invoke_agent span, its
// parent, and the running call's execute_tool span died unended with the
// process. The next command that opens the same store — `timebox run`,
// and `timebox runs` and `stats`, which only read — marks the turn
// interrupted and makes both spans, with the ids the first call names as
// its parent and the ids the running call's tool was given (its
// TRACEPARENT) — before, the call's span pointed to a parent no collector
// ever received, and the running call had no span. Killed mid-attempt
// instead (the model's stream silent after a chunk), the next run makes
// the attempt's chat span with the ids its llm_started named. Without the
// OTEL variables, runs makes none and says nothing of tracing.
func TestLostTurnSpanMadeByTheNextStart(t *testing.T) {
	bin := timeboxBinary(t)
	run := func(other, db string) []string { return []string{"run", "-f", other, "--db", db, "hello"} }
	for _, c := range []struct {
		name  string
		kill  func(t *testing.T, bin string, recv *testenv.OTLP) killed
		args  func(other, db string) []string
		said  string // what the next command says of the lost turn
		check func(t *testing.T, recv *testenv.OTLP, k killed)
	}{
		{"run", killMidTool, run, "marked 1 turn interrupted", checkLostSpans},
		{"runs list", killMidTool, func(_, db string) []string { return []string{"runs", "list", "--db", db} }, "interrupted", checkLostSpans},
		{"stats", killMidTool, func(_, db string) []string { return []string{"stats", "--db", db} }, "hang", checkLostSpans},
		{"run mid-attempt", killMidAttempt, run, "marked 1 turn interrupted", checkLostAttempt},
	} {
		t.Run(c.name, func(t *testing.T) {
			recv := testenv.NewOTLP(t)
			k := c.kill(t, bin, recv)
			next := exec.Command(bin, c.args(filepath.Join(k.dir, "other.yaml"), filepath.Join(k.dir, "timebox.db"))...)
			next.Env = k.env
			said, err := next.CombinedOutput()
			if err != nil || !strings.Contains(string(said), c.said) {
				t.Fatalf("the next command: %v\n%s", err, said)
			}
			c.check(t, recv, k)
		})
	}
	t.Run("runs list untraced", func(t *testing.T) {
		recv := testenv.NewOTLP(t)
		k := killMidTool(t, bin, recv)
		next := exec.Command(bin, "runs", "list", "--db", filepath.Join(k.dir, "timebox.db"))
		next.Env = append(k.env, "OTEL_SDK_DISABLED=true")
		said, err := next.CombinedOutput()
		if err != nil || !strings.Contains(string(said), "interrupted") || strings.Contains(string(said), "OTEL") {
			t.Fatalf("runs list: %v\n%s", err, said)
		}
		if n := len(recv.ByName()["invoke_agent lost-turn"]); n != 0 {
			t.Errorf("%d turn spans made by an untraced runs list", n)
		}
	})
}

// killed is what a traced `timebox run` killed with SIGKILL left: the
// directory of its store (timebox.db) and agent files (other.yaml, an
// agent that answers at once, among them), the environment that traces
// to the receiver, its turn's id, its first call's span (exported before
// the kill) and, killed mid-attempt, its second llm_started's
// traceparent.
type killed struct {
	dir     string
	env     []string
	turnID  string
	quick   *tracepb.Span
	attempt string
}

// tracedRun is a `timebox run --json go` traced to a receiver, in a
// directory of its own.
type tracedRun struct {
	killed
	db        string
	out, errb syncbuf.Buffer
	cmd       *exec.Cmd
}

// startTraced writes the agent file lost-turn (model script:m answering
// with script, tools as given, a YAML list) and other.yaml into dir,
// starts `timebox run` of lost-turn traced to recv, and waits
// until its first call's span (quick) is exported.
func startTraced(t *testing.T, bin string, recv *testenv.OTLP, dir, script, tools string) *tracedRun {
	t.Helper()
	r := &tracedRun{killed: killed{dir: dir}}
	r.db = filepath.Join(r.dir, "timebox.db")
	os.WriteFile(filepath.Join(r.dir, "script.jsonl"), []byte(script), 0o644)
	os.WriteFile(filepath.Join(r.dir, "hi.jsonl"), []byte(`{"text": "hi"}`+"\n"), 0o644)
	file := filepath.Join(r.dir, "agent.yaml")
	os.WriteFile(file, []byte("name: lost-turn\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+tools), 0o644)
	os.WriteFile(filepath.Join(r.dir, "other.yaml"), []byte("name: other\nmodel: {primary: script:m}\nproviders: {script: {file: hi.jsonl}}\n"), 0o644)
	r.env = append(os.Environ(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+recv.URL+"/v1/traces",
		"OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_BSP_SCHEDULE_DELAY=50")

	r.cmd = exec.Command(bin, "run", "-f", file, "--db", r.db, "--json", "go")
	r.cmd.Env, r.cmd.Stdout, r.cmd.Stderr = r.env, &r.out, &r.errb
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cmd.Process.Kill(); r.cmd.Wait() })
	if !wait.Until(20*time.Second, func() bool { return len(recv.ByName()["execute_tool quick"]) > 0 }) {
		t.Fatalf("the first call's span was never exported; spans %v\n%s", names(recv.ByName()), r.errb.String())
	}
	r.quick = recv.ByName()["execute_tool quick"][0]
	return r
}

// kill kills the run with SIGKILL and returns what it left, its turn's
// id and the traceparent of its second llm_started (if any) read from
// the events it wrote.
func (r *tracedRun) kill() killed {
	r.cmd.Process.Signal(syscall.SIGKILL)
	r.cmd.Wait()
	for line := range strings.Lines(r.out.String()) {
		var e event.Event
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			r.turnID = e.TurnID
		case *event.LLMStarted:
			if d.Step == 2 {
				r.attempt = d.Traceparent
			}
		}
	}
	return r.killed
}

// killMidTool runs `timebox run` traced to recv until its second call (hang)
// runs, its first call's span exported, and kills it with SIGKILL.
func killMidTool(t *testing.T, bin string, recv *testenv.OTLP) killed {
	t.Helper()
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	r := startTraced(t, bin, recv, dir, `{"tool_calls": [{"name": "quick"}]}`+"\n"+`{"tool_calls": [{"name": "hang"}]}`+"\n"+`{"text": "never"}`+"\n",
		fmt.Sprintf(`  - name: quick
    exec: [sh, -c, 'echo ok']
  - name: hang
    exec: [sh, -c, 'echo "$TRACEPARENT" > %s; echo $$ >> %s; exec sleep 300']
    timeout: 10m
`, filepath.Join(dir, "traceparent"), pidfile))
	pid := waitPid(t, pidfile, 1, r.errb.String)
	t.Cleanup(func() {
		var p int
		fmt.Sscan(pid, &p)
		syscall.Kill(p, syscall.SIGKILL)
	})
	k := r.kill()
	if k.turnID == "" {
		t.Fatalf("no turn_started in %q", r.out.String())
	}
	if n := len(recv.ByName()["invoke_agent lost-turn"]) + len(recv.ByName()["execute_tool hang"]); n != 0 {
		t.Fatalf("%d turn or hang spans before the next start; want none (the process died with them)", n)
	}
	return k
}

// killMidAttempt runs `timebox run` traced to recv until its second model
// attempt is under way (its llm_started stored, its stream silent after a
// chunk), its first call's span exported, and kills it with SIGKILL.
func killMidAttempt(t *testing.T, bin string, recv *testenv.OTLP) killed {
	t.Helper()
	r := startTraced(t, bin, recv, t.TempDir(), `{"tool_calls": [{"name": "quick"}]}`+"\n"+`{"chunks": ["Well, ", "never"], "stall_after": 1}`+"\n",
		"  - name: quick\n    exec: [sh, -c, 'echo ok']\n")
	// Its events are queued for the store: kill it once they are stored.
	ro, err := sql.Open("sqlite", "file:"+r.db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if !wait.Until(20*time.Second, func() bool {
		var n int
		err := ro.QueryRow(`SELECT count(*) FROM events WHERE type = 'llm_started'`).Scan(&n)
		return err == nil && n > 1
	}) {
		t.Fatalf("the second attempt's llm_started was never stored\n%s\n%s", r.out.String(), r.errb.String())
	}
	k := r.kill()
	if k.turnID == "" || k.attempt == "" {
		t.Fatalf("no turn_started, or no traceparent in the second llm_started, in %q", r.out.String())
	}
	if n := len(recv.ByName()["invoke_agent lost-turn"]) + len(recv.ByName()["chat m"]); n != 1 {
		t.Fatalf("%d turn or chat spans before the next start; want the first attempt's (the process died with the rest)", n)
	}
	return k
}

// lostTurnSpan returns the one span made of the turn k killed, and
// checks that it has the ids the first call names as its parent and the
// turn's id.
func lostTurnSpan(t *testing.T, recv *testenv.OTLP, k killed) *tracepb.Span {
	t.Helper()
	turns := recv.ByName()["invoke_agent lost-turn"]
	if len(turns) != 1 {
		t.Fatalf("%d spans of the lost turn; want 1; all: %v", len(turns), names(recv.ByName()))
	}
	turn := turns[0]
	if string(turn.GetTraceId()) != string(k.quick.GetTraceId()) || string(turn.GetSpanId()) != string(k.quick.GetParentSpanId()) ||
		testenv.SpanAttrs(turn)["timebox.turn.id"].GetStringValue() != k.turnID {
		t.Errorf("the turn's span is %s/%s of turn %q; the first call's parent is %s/%s, of turn %s",
			hex.EncodeToString(turn.GetTraceId()), hex.EncodeToString(turn.GetSpanId()), testenv.SpanAttrs(turn)["timebox.turn.id"].GetStringValue(),
			hex.EncodeToString(k.quick.GetTraceId()), hex.EncodeToString(k.quick.GetParentSpanId()), k.turnID)
	}
	return turn
}

// checkLostSpans checks the spans made of the turn killMidTool killed:
// the turn's, with the ids its first call names as its parent, and the
// running call's, with the ids its tool was given, under it.
func checkLostSpans(t *testing.T, recv *testenv.OTLP, k killed) {
	t.Helper()
	quick := k.quick
	turn := lostTurnSpan(t, recv, k)
	a := testenv.SpanAttrs(turn)
	if a["error.type"].GetStringValue() != "interrupted" ||
		turn.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || !strings.Contains(turn.GetStatus().GetMessage(), "hang") ||
		turn.GetStartTimeUnixNano() > quick.GetStartTimeUnixNano() || turn.GetEndTimeUnixNano() < quick.GetEndTimeUnixNano() {
		t.Errorf("the lost turn's span: attributes %v, status %v, %d–%d around the call's %d–%d", a, turn.GetStatus(),
			turn.GetStartTimeUnixNano(), turn.GetEndTimeUnixNano(), quick.GetStartTimeUnixNano(), quick.GetEndTimeUnixNano())
	}

	hangs := recv.ByName()["execute_tool hang"]
	if len(hangs) != 1 {
		t.Fatalf("%d spans of the call running at the kill; want 1; all: %v", len(hangs), names(recv.ByName()))
	}
	hang := hangs[0]
	given := strings.TrimSpace(readFile(filepath.Join(k.dir, "traceparent")))
	if made := fmt.Sprintf("00-%x-%x-01", hang.GetTraceId(), hang.GetSpanId()); made != given {
		t.Errorf("the running call's span is %s; its tool was given TRACEPARENT %q", made, given)
	}
	h := testenv.SpanAttrs(hang)
	if string(hang.GetParentSpanId()) != string(turn.GetSpanId()) || h["gen_ai.tool.name"].GetStringValue() != "hang" ||
		h["gen_ai.tool.call.id"].GetStringValue() != "call_2_1" || h["gen_ai.operation.name"].GetStringValue() != "execute_tool" ||
		h["gen_ai.tool.type"].GetStringValue() != "function" || h["timebox.step"].GetIntValue() != 2 ||
		h["timebox.budget.ms"].GetIntValue() != 600000 || h["timebox.budget.source"].GetStringValue() != "tool" ||
		!strings.HasPrefix(h["timebox.budget.knob"].GetStringValue(), "tools[hang].timeout") ||
		h["timebox.enforcement"].GetStringValue() != "hard" || h["timebox.outcome"].GetStringValue() != "interrupted" ||
		h["error.type"].GetStringValue() != "interrupted" || hang.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		!strings.HasPrefix(hang.GetStatus().GetMessage(), "Interrupted:") ||
		hang.GetEndTimeUnixNano() != turn.GetEndTimeUnixNano() || hang.GetStartTimeUnixNano() < quick.GetEndTimeUnixNano() {
		t.Errorf("the running call's span: parent %x (the turn's %x), attributes %v, status %v, %d–%d (the turn ends %d)",
			hang.GetParentSpanId(), turn.GetSpanId(), h, hang.GetStatus(), hang.GetStartTimeUnixNano(), hang.GetEndTimeUnixNano(),
			turn.GetEndTimeUnixNano())
	}
	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused: %v", bad)
	}
}

// checkLostAttempt checks the spans made of the turn killMidAttempt
// killed: the turn's, with the ids its first call names as its parent,
// and the attempt's, with the ids its llm_started named (those its model
// server was sent), under it, interrupted, ended at the turn's end (its
// last stored event, the attempt's chunk).
func checkLostAttempt(t *testing.T, recv *testenv.OTLP, k killed) {
	t.Helper()
	quick, attempt := k.quick, k.attempt
	turn := lostTurnSpan(t, recv, k)
	var chat *tracepb.Span
	for _, s := range recv.ByName()["chat m"] {
		if testenv.SpanAttrs(s)["timebox.step"].GetIntValue() == 2 {
			chat = s
		}
	}
	if chat == nil {
		t.Fatalf("no span of the attempt under way at the kill; all: %v", names(recv.ByName()))
	}
	if made := fmt.Sprintf("00-%x-%x-01", chat.GetTraceId(), chat.GetSpanId()); made != attempt {
		t.Errorf("the attempt's span is %s; its llm_started named %s", made, attempt)
	}
	c := testenv.SpanAttrs(chat)
	if string(chat.GetParentSpanId()) != string(turn.GetSpanId()) || c["gen_ai.operation.name"].GetStringValue() != "chat" ||
		c["gen_ai.request.model"].GetStringValue() != "m" || c["gen_ai.provider.name"].GetStringValue() != "script" ||
		c["timebox.attempt"].GetIntValue() != 1 || c["timebox.budget.knob"].GetStringValue() == "" ||
		c["timebox.outcome"].GetStringValue() != "interrupted" || c["error.type"].GetStringValue() != "interrupted" ||
		chat.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || !strings.Contains(chat.GetStatus().GetMessage(), "Model m was answering") ||
		chat.GetEndTimeUnixNano() != turn.GetEndTimeUnixNano() || chat.GetStartTimeUnixNano() < quick.GetEndTimeUnixNano() {
		t.Errorf("the attempt's span: parent %x (the turn's %x), attributes %v, status %v, %d–%d (the turn ends %d)",
			chat.GetParentSpanId(), turn.GetSpanId(), c, chat.GetStatus(), chat.GetStartTimeUnixNano(), chat.GetEndTimeUnixNano(),
			turn.GetEndTimeUnixNano())
	}
	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused: %v", bad)
	}
}
