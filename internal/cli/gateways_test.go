//go:build !windows

package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// tickTool reports progress every 100ms until it is stopped, after writing
// its pid to the file PIDFILE names.
const tickTool = `#!/usr/bin/env bash
cat >/dev/null
echo "$$" >> "$PIDFILE"
n=0
while true; do n=$((n+1)); echo "::progress:: tick $n" >&2; sleep 0.1; done
`

// gatewayHeartbeat is the heartbeat of the gateways of TestTwoServeOnePostgres:
// a gateway silent for three of them is taken for gone.
const gatewayHeartbeat = 500 * time.Millisecond

// TestTwoServeOnePostgres runs two `timebox serve --db postgres://…` on one
// database, as a new user would: a detached turn started on A is followed
// live on B (progress arrives while its tool runs), cancelled through B,
// and its record says cancelled on both, its tool stopped. Then A is
// killed (SIGKILL) mid-turn: B marks the turn interrupted within the
// heartbeat window, and B's follower sees it end.
func TestTwoServeOnePostgres(t *testing.T) {
	bin := timeboxBinary(t)
	// The test cluster trusts loopback, so a password is accepted and
	// ignored: it is there to be kept out of what timebox prints.
	dsn := strings.Replace(testenv.Postgres(t), "postgres@", "postgres:sekrit@", 1) + "&" +
		postgres.HeartbeatParam + "=" + gatewayHeartbeat.String()
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	os.WriteFile(filepath.Join(dir, "tick.sh"), []byte(tickTool), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(strings.Repeat(`{"tool_calls": [{"name": "tick"}]}`+"\n"+`{"text": "never"}`+"\n", 2)), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: gw\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: tick\n    exec: [./tick.sh]\n    timeout: 10m\n"), 0o644)
	env := append(os.Environ(), "PIDFILE="+pidfile)

	var errA, errB syncbuf.Buffer
	serveA, urlA := startServe(t, bin, file, dsn, env, &errA)
	_, urlB := startServe(t, bin, file, dsn, env, &errB)
	if strings.Contains(errA.String()+errB.String(), "sekrit") {
		t.Fatal("a password was printed")
	}
	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()

	// 1. Started on A, followed and cancelled on B.
	id := startDetached(t, c, urlA)
	pid := waitPid(t, pidfile, 1, errA.String)
	resp, err := c.Get(urlB + "/v1/turns/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	follow := newFollower(resp.Body)
	for progress := 0; progress < 3; {
		typ, data := follow.next(t)
		switch typ {
		case "tool_progress":
			progress++
		case "turn_finished", "":
			t.Fatalf("B's follower: %q %s before the cancel\nA: %s\nB: %s", typ, data, errA.String(), errB.String())
		}
	}
	cancelResp, err := c.Post(urlB+"/v1/turns/"+id+"/cancel", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec event.Turn
	json.NewDecoder(cancelResp.Body).Decode(&rec)
	cancelResp.Body.Close()
	if cancelResp.StatusCode != http.StatusOK || rec.Status != budget.StatusCancelled {
		t.Fatalf("cancel through B: %d %s %s", cancelResp.StatusCode, rec.Status, rec.Message)
	}
	for typ, _ := follow.next(t); typ != "turn_finished"; typ, _ = follow.next(t) {
		if typ == "" {
			t.Fatal("B's follower ended without turn_finished")
		}
	}
	resp.Body.Close()
	for _, u := range []string{urlA, urlB} {
		if got := getTurn(t, c, u, id); got.Status != budget.StatusCancelled {
			t.Fatalf("%s says %s", u, got.Status)
		}
	}
	if !waitDead(pid, 10*time.Second) {
		t.Fatalf("the tool (pid %s) outlived its cancelled turn", pid)
	}

	// 2. A killed mid-turn: B marks its turn interrupted.
	id = startDetached(t, c, urlA)
	pid = waitPid(t, pidfile, 2, errA.String)
	resp, err = c.Get(urlB + "/v1/turns/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	follow = newFollower(resp.Body)
	for typ, _ := follow.next(t); typ != "tool_progress"; typ, _ = follow.next(t) {
	}
	serveA.Process.Kill()
	serveA.Wait()
	killed := time.Now()
	t.Cleanup(func() {
		var p int
		fmt.Sscan(pid, &p)
		syscall.Kill(p, syscall.SIGKILL)
	})
	for typ, _ := follow.next(t); typ != "turn_finished"; typ, _ = follow.next(t) {
		if typ == "" {
			t.Fatal("B's follower ended without turn_finished")
		}
	}
	took := time.Since(killed)
	got := getTurn(t, c, urlB, id)
	if got.Status != budget.StatusInterrupted || !strings.Contains(got.Message, "stopped sending heartbeats") ||
		len(got.ToolCalls) != 1 || got.ToolCalls[0].Outcome != event.OutcomeInterrupted {
		t.Fatalf("B's record: %s: %s %+v", got.Status, got.Message, got.ToolCalls)
	}
	// Three heartbeats of A's silence, counted from its last beat, plus
	// up to one of B's until it looks (the window the docs give); generous
	// slack for a loaded machine after it, little before it (the kill is
	// timed when serve was reaped): a gateway taken for gone sooner could be
	// a live one.
	earliest, latest := postgres.GoneWindow(gatewayHeartbeat)
	if took < earliest-gatewayHeartbeat/2 || took > latest+5*time.Second {
		t.Errorf("B marked the turn interrupted %s after A died; want between %s and %s", took, earliest, latest)
	}
	t.Logf("B marked the turn interrupted %s after A was killed (heartbeat %s)", took.Round(time.Millisecond), gatewayHeartbeat)
	if !waitDead(pid, 5*time.Second) {
		t.Errorf("the tool (pid %s) outlived the killed gateway", pid)
	}
}

func startDetached(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Post(url+"/v1/turns", "application/json", strings.NewReader(`{"input": "go", "detach": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var acc struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&acc); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/turns: %d %v", resp.StatusCode, err)
	}
	return acc.TurnID
}

func getTurn(t *testing.T, c *http.Client, url, id string) event.Turn {
	t.Helper()
	resp, err := c.Get(url + "/v1/turns/" + id + "?events=false")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rec event.Turn
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET turn %s: %d %v", id, resp.StatusCode, err)
	}
	return rec
}

// waitPid waits until pidfile has n lines and returns the last.
func waitPid(t *testing.T, pidfile string, n int, log func() string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines := strings.Fields(readFile(pidfile))
		if len(lines) >= n {
			return lines[n-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tool never started: %s", log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// follower reads an SSE stream's events.
type follower struct {
	body io.Reader
	buf  []byte
}

func newFollower(r io.Reader) *follower { return &follower{body: r} }

// next returns the next event's type and data; "" when the stream ended.
func (f *follower) next(t *testing.T) (string, string) {
	t.Helper()
	for {
		if i := strings.Index(string(f.buf), "\n\n"); i >= 0 {
			block := string(f.buf[:i])
			f.buf = f.buf[i+2:]
			var typ, data string
			for line := range strings.Lines(block) {
				line = strings.TrimRight(line, "\n")
				if v, ok := strings.CutPrefix(line, "event: "); ok {
					typ = v
				}
				if v, ok := strings.CutPrefix(line, "data: "); ok {
					data = v
				}
			}
			if typ != "" {
				return typ, data
			}
			continue
		}
		b := make([]byte, 4096)
		n, err := f.body.Read(b)
		f.buf = append(f.buf, b[:n]...)
		if err != nil && n == 0 {
			return "", err.Error()
		}
	}
}

// TestRunCancelledThroughTheStore: a `timebox run` storing its turn in
// PostgreSQL is cancelled by a cancel request made through the store (as
// `POST /v1/turns/ID/cancel` to any timebox serve on it makes one): its
// tool is stopped and its record says who cancelled it.
func TestRunCancelledThroughTheStore(t *testing.T) {
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "hang"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("model: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: hang\n    exec: [sleep, \"300\"]\n    timeout: 10m\n"), 0o644)
	done := make(chan result, 1)
	go func() { done <- run(t, nil, "run", "-f", file, "--db", dsn, "--json", "go") }()

	st, err := postgres.Open(t.Context(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(30 * time.Second)
	var id string
	for id == "" {
		if time.Now().After(deadline) {
			t.Fatal("timebox run stored no running turn")
		}
		time.Sleep(20 * time.Millisecond)
		list, err := st.Turns(t.Context(), store.Filter{Status: budget.StatusRunning})
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range list {
			if ts.ToolCalls == 0 {
				evs, _ := st.Events(t.Context(), ts.TurnID, 0, 0)
				for _, e := range evs {
					if e.Type == event.TypeToolStarted {
						id = ts.TurnID
					}
				}
			}
		}
	}
	if err := st.RequestCancel(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.code != cli.ExitCancelled || !strings.Contains(r.out, `"stop_reason":"cancelled"`) {
			t.Fatalf("exit %d\n%s\n%s", r.code, r.out, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("timebox run was not cancelled")
	}
	rec, err := st.Turn(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != budget.StatusCancelled || !strings.Contains(rec.Message, "a client of timebox serve") {
		t.Fatalf("%s: %s", rec.Status, rec.Message)
	}
}
