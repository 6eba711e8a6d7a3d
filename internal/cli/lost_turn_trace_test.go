//go:build !windows

package cli_test

import (
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
)

// TestLostTurnSpanMadeByTheNextStart: `timebox run`, traced to a real OTLP
// receiver, is killed with SIGKILL while its turn's second tool runs. The
// first call's span was exported; the turn's invoke_agent span, its
// parent, died unended with the process. The next `timebox run` on the
// same store marks the turn interrupted and makes that span, with the ids
// the first call names as its parent — before, the call's span pointed
// to a parent no collector ever received.
func TestLostTurnSpanMadeByTheNextStart(t *testing.T) {
	bin := timeboxBinary(t)
	recv := testenv.NewOTLP(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "timebox.db")
	pidfile := filepath.Join(dir, "pids")
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "quick"}]}`+"\n"+`{"tool_calls": [{"name": "hang"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "hi.jsonl"), []byte(`{"text": "hi"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`name: lost-turn
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
tools:
  - name: quick
    exec: [sh, -c, 'echo ok']
  - name: hang
    exec: [sh, -c, 'echo $$ >> %s; exec sleep 300']
    timeout: 10m
`, pidfile)), 0o644)
	other := filepath.Join(dir, "other.yaml")
	os.WriteFile(other, []byte("name: other\nmodel: {primary: script:m}\nproviders: {script: {file: hi.jsonl}}\n"), 0o644)
	env := append(os.Environ(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+recv.URL+"/v1/traces",
		"OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_BSP_SCHEDULE_DELAY=50")

	var out, errb syncbuf.Buffer
	run := exec.Command(bin, "run", "-f", file, "--db", db, "--json", "go")
	run.Env, run.Stdout, run.Stderr = env, &out, &errb
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill(); run.Wait() })
	pid := waitPid(t, pidfile, 1, errb.String)
	t.Cleanup(func() {
		var p int
		fmt.Sscan(pid, &p)
		syscall.Kill(p, syscall.SIGKILL)
	})
	var quick *tracepb.Span
	for deadline := time.Now().Add(20 * time.Second); quick == nil; time.Sleep(20 * time.Millisecond) {
		if s := recv.ByName()["execute_tool quick"]; len(s) > 0 {
			quick = s[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first call's span was never exported; spans %v\n%s", names(recv.ByName()), errb.String())
		}
	}
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	var turnID string
	for line := range strings.Lines(out.String()) {
		var e event.Event
		if json.Unmarshal([]byte(line), &e) == nil && e.Type == event.TypeTurnStarted {
			turnID = e.TurnID
		}
	}
	if turnID == "" {
		t.Fatalf("no turn_started in %q", out.String())
	}
	if n := len(recv.ByName()["invoke_agent lost-turn"]); n != 0 {
		t.Fatalf("%d turn spans before the next start; want none (the process died with it)", n)
	}

	next := exec.Command(bin, "run", "-f", other, "--db", db, "hello")
	next.Env = env
	said, err := next.CombinedOutput()
	if err != nil || !strings.Contains(string(said), "marked 1 turn interrupted") {
		t.Fatalf("the next run: %v\n%s", err, said)
	}
	turns := recv.ByName()["invoke_agent lost-turn"]
	if len(turns) != 1 {
		t.Fatalf("%d spans of the lost turn; want 1; all: %v", len(turns), names(recv.ByName()))
	}
	turn := turns[0]
	a := testenv.SpanAttrs(turn)
	if string(turn.GetTraceId()) != string(quick.GetTraceId()) || string(turn.GetSpanId()) != string(quick.GetParentSpanId()) {
		t.Errorf("the turn's span is %s/%s; the first call's parent is %s/%s",
			hex.EncodeToString(turn.GetTraceId()), hex.EncodeToString(turn.GetSpanId()),
			hex.EncodeToString(quick.GetTraceId()), hex.EncodeToString(quick.GetParentSpanId()))
	}
	if a["timebox.turn.id"].GetStringValue() != turnID || a["error.type"].GetStringValue() != "interrupted" ||
		turn.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || !strings.Contains(turn.GetStatus().GetMessage(), "hang") ||
		turn.GetStartTimeUnixNano() > quick.GetStartTimeUnixNano() || turn.GetEndTimeUnixNano() < quick.GetEndTimeUnixNano() {
		t.Errorf("the lost turn's span: attributes %v, status %v, %d–%d around the call's %d–%d", a, turn.GetStatus(),
			turn.GetStartTimeUnixNano(), turn.GetEndTimeUnixNano(), quick.GetStartTimeUnixNano(), quick.GetEndTimeUnixNano())
	}
	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused: %v", bad)
	}
}
