//go:build !windows

package mcptool

// Tests against real MCP servers from npm, pinned in testdata/package.json
// and testdata/package-lock.json. The first test that needs them installs
// them (`npm ci --prefix tool/mcptool/testdata`); without node, or when the
// install fails, they skip, unless TB_TEST_REQUIRE=npm (CI), when they fail.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
)

// npmBin returns the path of an installed server's binary, installing the
// pinned packages first if need be (internal/testenv.NPM).
func npmBin(t *testing.T, name string) string {
	t.Helper()
	dir := testenv.NPM(t, "testdata")
	p := filepath.Join(dir, "node_modules", ".bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not in the pinned packages of %s/package.json: %v", name, dir, err)
	}
	return p
}

// openEverything starts server-everything over stdio.
func openEverything(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	bin := npmBin(t, "mcp-server-everything")
	noLeftovers(t)
	cfg := Config{Name: "everything", Command: []string{bin, "stdio"}, Budget: tb(10*time.Second, 0)}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// pid returns the server's current process id.
func (s *Server) pid(t *testing.T) int {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || s.cur.proc == nil {
		t.Fatal("the server is not running")
	}
	return s.cur.proc.pid
}

// down reports whether the server is down (its link gone).
func (s *Server) down() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur == nil
}

const longOp = "trigger-long-running-operation"

func longArgs(duration float64, steps int) string {
	return fmt.Sprintf(`{"duration": %g, "steps": %d}`, duration, steps)
}

func TestEverythingTools(t *testing.T) {
	s := openEverything(t, func(c *Config) {
		c.Overrides = map[string]Override{longOp: {Timeout: budget.Duration{D: 30 * time.Second, Source: budget.SourceTool, Knob: "tools[everything].overrides[trigger-long-running-operation].timeout in agent.yaml"},
			IdleTimeout: budget.Duration{D: 5 * time.Second, Source: budget.SourceTool}}}
	})
	names := map[string]bool{}
	for _, tl := range s.Tools() {
		names[tl.Spec().Name] = true
		if tl.Spec().Description == "" {
			t.Errorf("%s has no description", tl.Spec().Name)
		}
	}
	for _, want := range []string{"everything__echo", "everything__get-sum", "everything__" + longOp} {
		if !names[want] {
			t.Errorf("no tool %s among %v", want, names)
		}
	}
	var schema struct {
		Properties map[string]any `json:"properties"`
		Required   []string       `json:"required"`
	}
	if err := json.Unmarshal(find(t, s, "get-sum").Spec().InputSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Properties["a"] == nil || schema.Properties["b"] == nil || len(schema.Required) != 2 {
		t.Errorf("get-sum schema %s", find(t, s, "get-sum").Spec().InputSchema)
	}
	if b := find(t, s, longOp).Budget(); b.Timeout.D != 30*time.Second || b.IdleTimeout.D != 5*time.Second {
		t.Errorf("%s budget %+v, want the override", longOp, b)
	}
	if b := find(t, s, "echo").Budget(); b.Timeout.D != 10*time.Second || b.Timeout.Knob != knob {
		t.Errorf("echo budget %+v, want the entry's", b)
	}

	x, _ := call(context.Background(), t, s, "get-sum", `{"a": 2, "b": 40}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	if !strings.Contains(output(x), "42") {
		t.Errorf("get-sum said %q", output(x))
	}
	x, _ = call(context.Background(), t, s, "echo", `{"message": "héllo"}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	if !strings.Contains(output(x), "héllo") {
		t.Errorf("echo said %q", output(x))
	}
	// Arguments the server refuses: its error comes back as a tool error.
	x, _ = call(context.Background(), t, s, "get-sum", `{"a": "two"}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeError, "")
}

// TestEverythingBudgets runs the long-running operation, whose progress
// comes at a known cadence (duration/steps), under each kind of budget.
func TestEverythingBudgets(t *testing.T) {
	var mu sync.Mutex
	cancelled := map[string]time.Time{}
	s := openEverything(t, func(c *Config) {
		c.onCancel = func(token string, at time.Time) { mu.Lock(); cancelled[token] = at; mu.Unlock() }
	})
	const slack = 150 * time.Millisecond
	cases := []struct {
		name          string
		args          string
		timeout, idle time.Duration
		outcome       event.Outcome
		phase         budget.Phase
		at            time.Duration // when it should end (for stops)
		minReports    int
	}{
		{"completes with progress", longArgs(1, 5), 5 * time.Second, 500 * time.Millisecond, event.OutcomeOK, "", 0, 5},
		{"idle stop: progress every 1.5s, idle 500ms", longArgs(3, 2), 5 * time.Second, 500 * time.Millisecond, event.OutcomeTimedOut, budget.PhaseToolIdle, 500 * time.Millisecond, 0},
		{"timeout while progress keeps coming", longArgs(5, 25), time.Second, 500 * time.Millisecond, event.OutcomeTimedOut, budget.PhaseTool, time.Second, 3},
		{"timeout with no progress", longArgs(2, 1), time.Second, 0, event.OutcomeTimedOut, budget.PhaseTool, time.Second, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.Stats()
			x, r := call(context.Background(), t, s, longOp, tc.args, tb(tc.timeout, tc.idle))
			wantOutcome(t, x, tc.outcome, tc.phase)
			if r.len() < tc.minReports || r.len() != x.Progress {
				t.Errorf("%d progress reports (%d in the record), want at least %d", r.len(), x.Progress, tc.minReports)
			}
			if tc.outcome == event.OutcomeOK {
				if !strings.Contains(output(x), "completed") {
					t.Errorf("output %q", output(x))
				}
				return
			}
			near(t, "stopped after", x.Elapsed(), tc.at, slack)
			token := "call_" + longOp + fmt.Sprintf("#%d", s.seq.Load())
			var sent time.Time
			wait.For(t, time.Second, "the cancellation sent", func() bool {
				mu.Lock()
				defer mu.Unlock()
				sent = cancelled[token]
				return !sent.IsZero()
			})
			near(t, "cancellation sent after", sent.Sub(x.Started), tc.at, slack)
			if tc.name == "timeout with no progress" {
				// The operation ignores cancellation: its one progress
				// notification still comes, at 2s, and is dropped. Its
				// reply never comes: the server got the cancellation.
				wait.For(t, 3*time.Second, "the late progress", func() bool { return s.Stats().LateProgress > before.LateProgress })
				// The server writes the operation's reply right after its
				// last progress notification, and the client reads in
				// order: once a call sent after that progress is answered,
				// a reply to the cancelled call would have been read.
				x, _ := call(context.Background(), t, s, "echo", `{"message": "after"}`, budget.ToolBudget{})
				wantOutcome(t, x, event.OutcomeOK, "")
				if st := s.Stats(); st.LateReplies != before.LateReplies {
					t.Errorf("the server replied after the cancellation (%+v): it did not get it", st)
				}
			}
		})
	}
	// After all that the server is the same one, and answers.
	x, _ := call(context.Background(), t, s, "echo", `{"message": "still here"}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 1 {
		t.Errorf("starts %d, want 1", st.Starts)
	}
}

func TestEverythingCancelThenCall(t *testing.T) {
	s := openEverything(t, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	// Measured from when the cancel is armed, which is a moment before the
	// call starts: the call's own elapsed time can be a hair under 500ms.
	armed := time.Now()
	time.AfterFunc(500*time.Millisecond, func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the client"}) })
	x, r := call(ctx, t, s, longOp, longArgs(3, 10), tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeCancelled, budget.PhaseCancel)
	near(t, "stopped after", x.Ended.Sub(armed), 500*time.Millisecond, 150*time.Millisecond)
	if r.len() < 1 {
		t.Errorf("%d progress reports before the cancel, want 1 or 2", r.len())
	}
	x, _ = call(context.Background(), t, s, "get-sum", `{"a": 1, "b": 2}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if x.Elapsed() > 500*time.Millisecond {
		t.Errorf("the next call took %s: the cancelled one held the server up", x.Elapsed())
	}
}

// TestEverythingKilledMidCall: the server dies during a call; the call gets
// a tool error saying so at once, and the next call restarts it.
func TestEverythingKilledMidCall(t *testing.T) {
	s := openEverything(t, nil)
	pid := s.pid(t)
	time.AfterFunc(300*time.Millisecond, func() { syscall.Kill(pid, syscall.SIGKILL) })
	x, _ := call(context.Background(), t, s, longOp, longArgs(5, 10), tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	if msg := x.Err.Error(); !strings.Contains(msg, "exited (killed by signal killed) during the call") {
		t.Errorf("error %q", msg)
	}
	near(t, "failed after", x.Elapsed(), 300*time.Millisecond, 300*time.Millisecond)
	x, _ = call(context.Background(), t, s, "get-sum", `{"a": 1, "b": 2}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 2 || s.pid(t) == pid {
		t.Errorf("starts %d, pid %d (was %d): want a restarted server", st.Starts, s.pid(t), pid)
	}
}

// TestEverythingHung: a stopped (SIGSTOP) server answers nothing; its
// call is stopped at its own timeout, and once no call runs the pings
// tell it is hung, and it is replaced.
func TestEverythingHung(t *testing.T) {
	s := openEverything(t, func(c *Config) { c.KeepAlive = 200 * time.Millisecond })
	pid := s.pid(t)
	time.AfterFunc(100*time.Millisecond, func() { syscall.Kill(pid, syscall.SIGSTOP) })
	x, _ := call(context.Background(), t, s, longOp, longArgs(5, 10), tb(2*time.Second, 0))
	wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
	if !wait.Until(10*time.Second, func() bool { return s.Stats().Starts == 1 && s.down() }) {
		t.Fatalf("the hung server was not stopped once its call had ended")
	}
	x, _ = call(context.Background(), t, s, "get-sum", `{"a": 1, "b": 2}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 2 || s.pid(t) == pid {
		t.Errorf("starts %d: want a restarted server", st.Starts)
	}
}

// TestServerChildrenDie: a server started through a wrapper (as npx starts
// node) is a process tree; killing its leader, or closing it, leaves
// nothing behind. noLeftovers checks.
func TestServerChildrenDie(t *testing.T) {
	bin := npmBin(t, "mcp-server-everything")
	// The shell stays the parent of node: it has work after node exits.
	cmd := []string{"/bin/sh", "-c", bin + " stdio; echo server gone >&2"}
	s := openEverything(t, func(c *Config) { c.Command = cmd })
	leader := s.pid(t)
	time.AfterFunc(300*time.Millisecond, func() { syscall.Kill(leader, syscall.SIGKILL) })
	x, _ := call(context.Background(), t, s, longOp, longArgs(5, 10), tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	if left := marked(); len(left) > 0 { // the restart is not started yet; nothing should run
		t.Errorf("after the leader died, processes %v are alive", left)
	}
	x, _ = call(context.Background(), t, s, "echo", `{"message": "x"}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %s", d)
	}
	if left := marked(); len(left) > 0 {
		t.Errorf("after Close, processes %v are alive", left)
	}
}

// TestServerEscapeesDie: a descendant that left the server's process group
// and session (setsid) is still part of the server's tree, and is gone
// when the server is closed.
func TestServerEscapeesDie(t *testing.T) {
	bin := npmBin(t, "mcp-server-everything")
	s := openEverything(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "setsid sleep 300 & exec " + bin + " stdio"}
	})
	x, _ := call(context.Background(), t, s, "echo", `{"message": "x"}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if left := marked(); len(left) != 2 {
		t.Errorf("processes %v, want the server and its escaped sleep", left)
	}
	s.Close()
	if left := marked(); len(left) > 0 {
		t.Errorf("after Close, processes %v are alive", left)
	}
}

func TestStartFailures(t *testing.T) {
	noLeftovers(t)
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no such program", Config{Command: []string{"/nonexistent/mcp-server"}}, "no such file or directory"},
		{"exits at once", Config{Command: []string{"/bin/sh", "-c", "echo cannot open the database >&2; exit 3"}},
			"exited before it was ready (exit status 3); its stderr ends: cannot open the database"},
		{"never answers", Config{Command: []string{"/bin/sh", "-c", "sleep 30"}, StartTimeout: 300 * time.Millisecond},
			"did not answer initialize and tools/list within 300ms, the start timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Name = "broken"
			tc.cfg.Budget = tb(time.Second, 0)
			start := time.Now()
			s, err := Open(context.Background(), tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Open took %s to fail", d)
			}
		})
	}
}

// TestMemoryServer uses a realistic server: a knowledge graph.
func TestMemoryServer(t *testing.T) {
	bin := npmBin(t, "mcp-server-memory")
	noLeftovers(t)
	t.Setenv("MEMORY_FILE_PATH", filepath.Join(t.TempDir(), "memory.jsonl"))
	s, err := Open(context.Background(), Config{Name: "memory", Command: []string{bin}, Budget: tb(10*time.Second, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x, _ := call(context.Background(), t, s, "memory__create_entities",
		`{"entities": [{"name": "timebox", "entityType": "project", "observations": ["keeps budgets honest"]}]}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	x, _ = call(context.Background(), t, s, "memory__search_nodes", `{"query": "budgets"}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	if !strings.Contains(output(x), "keeps budgets honest") {
		t.Errorf("search_nodes said %q", output(x))
	}
}

// TestEverythingHTTP runs server-everything's streamable HTTP transport.
func TestEverythingHTTP(t *testing.T) {
	bin := npmBin(t, "mcp-server-everything")
	noLeftovers(t)
	port := freePort(t)
	srv := exec.Command(bin, "streamableHttp")
	srv.Env = append(os.Environ(), "PORT="+port)
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
		srv.Wait()
	})
	url := "http://127.0.0.1:" + port + "/mcp"
	wait.For(t, 10*time.Second, "the HTTP server listening", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	s, err := Open(context.Background(), Config{Name: "everything", URL: url, Budget: tb(10*time.Second, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x, r := call(context.Background(), t, s, longOp, longArgs(1, 4), tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if r.len() != 4 {
		t.Errorf("%d progress reports over HTTP, want 4", r.len())
	}
	x, _ = call(context.Background(), t, s, longOp, longArgs(3, 1), tb(time.Second, 0))
	wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
	near(t, "stopped after", x.Elapsed(), time.Second, 150*time.Millisecond)
	wait.For(t, time.Second, "cancellation sent", func() bool { return s.Stats().CancelsSent == 1 })
	x, _ = call(context.Background(), t, s, "get-sum", `{"a": 1, "b": 2}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// TestHTTPHeaders: an entry's headers, and the negotiated protocol version,
// go with every request to a streamable HTTP server.
func TestHTTPHeaders(t *testing.T) {
	f := newFake()
	var mu sync.Mutex
	type seenRequest struct {
		method string
		header http.Header
	}
	var seen []seenRequest
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct{ Method string }
		_ = json.Unmarshal(body, &m)
		mu.Lock()
		seen = append(seen, seenRequest{m.Method, r.Header.Clone()})
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	defer ts.Close()
	s, err := Open(context.Background(), Config{Name: "fake", URL: ts.URL, Headers: map[string]string{"Authorization": "Bearer t0ken"},
		Budget: tb(5*time.Second, 0)})
	if err != nil {
		t.Fatal(err)
	}
	x, r := call(context.Background(), t, s, "progress", `{"n": 3}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if r.len() != 3 {
		t.Errorf("%d progress reports, want 3", r.len())
	}
	x, _ = call(context.Background(), t, s, "block", `{}`, tb(200*time.Millisecond, 0))
	wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
	wait.For(t, time.Second, "the server cancelled the call", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.unblocked) == 1
	})
	if st := s.Stats(); st.CancelsSent != 1 {
		t.Errorf("stats %+v, want one cancellation sent", st)
	}
	s.Close()
	mu.Lock()
	defer mu.Unlock()
	for i, r := range seen {
		if r.header.Get("Authorization") != "Bearer t0ken" {
			t.Errorf("request %d (%s) has no Authorization header", i, r.method)
		}
		if r.method != "initialize" && r.header.Get("Mcp-Protocol-Version") == "" {
			t.Errorf("request %d (%s) has no protocol version: %v", i, r.method, r.header)
		}
	}
}

// TestEverythingRestartOnIgnoredCancel: server-everything's long operation
// ignores its cancellation (and, as MCP's TypeScript SDK has it, a
// cancelled request is never answered): with RestartOnIgnoredCancel its
// server is killed kill_grace after the timeout, the call's result says
// so, and the next call gets a fresh server.
func TestEverythingRestartOnIgnoredCancel(t *testing.T) {
	s := openEverything(t, func(c *Config) { c.RestartOnIgnoredCancel = true })
	old := s.pid(t)
	x, _ := call(context.Background(), t, s, longOp, longArgs(10, 10), tb(time.Second, 0))
	wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
	near(t, "answered after", x.Elapsed(), 1500*time.Millisecond, time.Second)
	if x.Result == nil || !x.Result.ServerRestarted {
		t.Fatalf("result %+v: want the server restarted", x.Result)
	}
	x, _ = call(context.Background(), t, s, "echo", `{"message": "fresh"}`, budget.ToolBudget{})
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 2 || st.IgnoredCancelRestarts != 1 || s.pid(t) == old {
		t.Errorf("stats %+v, pid %d (old %d): want one restart, a new server", st, s.pid(t), old)
	}
}
