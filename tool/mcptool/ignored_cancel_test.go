//go:build linux

package mcptool

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/mcptest"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/tool"
)

// openStubborn starts the test binary as internal/mcptest's stdio server,
// whose stubborn tool ignores its cancellation, and returns it with the
// file its stubborn calls write their pids to.
func openStubborn(t *testing.T, restart bool) (*Server, string) {
	t.Helper()
	noLeftovers(t)
	pids := filepath.Join(t.TempDir(), "pids")
	t.Setenv(mcptest.EnvServe, "1")
	t.Setenv(mcptest.EnvPids, pids)
	s, err := Open(context.Background(), Config{Name: "slow", Command: mcptest.Command(), Budget: tb(10*time.Second, 0),
		KeepAlive: -1, RestartOnIgnoredCancel: restart})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, pids
}

// alivePid reports whether pid runs: a zombie has exited.
func alivePid(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) < i+3 || b[i+2] != 'Z'
}

func pidsIn(t *testing.T, file string) []int {
	t.Helper()
	b, _ := os.ReadFile(file)
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

// TestRestartOnIgnoredCancel: with RestartOnIgnoredCancel, a call whose
// server goes on with it after its timeout's cancellation is answered
// tool_timeout once the server's whole tree (its child in a session of
// its own included) is killed, kill_grace after the cancellation; its
// record says the server was restarted. A call in flight on the same
// server fails with a tool error saying why, and the next call gets a
// fresh server. Without it (keep), the same server answers the next call.
func TestRestartOnIgnoredCancel(t *testing.T) {
	for _, restart := range []bool{true, false} {
		t.Run("restart="+strconv.FormatBool(restart), func(t *testing.T) {
			s, pids := openStubborn(t, restart)
			ctx := context.Background()
			x, _ := call(ctx, t, s, "echo", `{}`, budget.ToolBudget{})
			wantOutcome(t, x, event.OutcomeOK, "")
			first := output(x)

			// A call in flight on the server, answered only when cancelled.
			inflight := make(chan *tool.Execution, 1)
			go func() {
				x, _ := call(ctx, t, s, "polite", `{}`, tb(time.Minute, 0))
				inflight <- x
			}()

			began := time.Now()
			restarts := tool.ServerRestarts()
			x, _ = call(ctx, t, s, "stubborn", `{}`, tb(time.Second, 0))
			took := time.Since(began)
			wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
			got := pidsIn(t, pids)
			if len(got) != 2 {
				t.Fatalf("stubborn wrote pids %v, want the server's and its child's", got)
			}
			if !restart {
				// The server runs on, and so does the call's work in it.
				if x.Result != nil && x.Result.ServerRestarted {
					t.Error("the record says the server was restarted")
				}
				if took > 1500*time.Millisecond {
					t.Errorf("answered after %v: without restart a call returns at its deadline", took)
				}
				for _, p := range got {
					if !alivePid(p) {
						t.Errorf("process %d was stopped; keep leaves the server running", p)
					}
				}
				x, _ = call(ctx, t, s, "echo", `{}`, budget.ToolBudget{})
				if output(x) != first || s.Stats().IgnoredCancelRestarts != 0 {
					t.Errorf("echo answered by pid %s (first %s), %d restarts: want the same server", output(x), first, s.Stats().IgnoredCancelRestarts)
				}
				s.Close()
				<-inflight
				return
			}
			// 1s timeout, then 500ms kill grace for the server to answer.
			if took < 1500*time.Millisecond || took > 3*time.Second {
				t.Errorf("answered after %v, want about 1.5s (1s timeout, 500ms kill grace)", took)
			}
			if x.Result == nil || !x.Result.ServerRestarted ||
				!strings.Contains(x.Result.StderrTail, `MCP server "slow" had not answered a cancelled call to "stubborn" 500ms after its cancellation (mcp.on_ignored_cancel: restart)`) {
				t.Errorf("result %+v: want the restart noted", x.Result)
			}
			if msg := tool.ModelResult("slow__stubborn", tb(time.Second, 0), x); !strings.Contains(msg, "restarted the server") {
				t.Errorf("the model is not told: %s", msg)
			}
			for _, p := range got {
				if alivePid(p) {
					t.Errorf("process %d of the restarted server is alive", p)
				}
			}
			select {
			case x := <-inflight:
				wantOutcome(t, x, event.OutcomeError, "")
				if !strings.Contains(x.Err.Error(), `MCP server "slow" was restarted during the call to "polite": it had not answered a cancelled call to "stubborn"`) {
					t.Errorf("the call in flight failed with: %v", x.Err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the call in flight was not failed")
			}
			// A fresh server is started at once, not by the next call.
			if !wait.Until(10*time.Second, func() bool { return s.Stats().Starts == 2 }) {
				t.Fatalf("no fresh server started: %+v", s.Stats())
			}
			x, _ = call(ctx, t, s, "echo", `{}`, budget.ToolBudget{})
			wantOutcome(t, x, event.OutcomeOK, "")
			if output(x) == first {
				t.Errorf("echo answered by the old server (pid %s)", first)
			}
			if n := s.Stats().IgnoredCancelRestarts; n != 1 {
				t.Errorf("%d restarts counted, want 1", n)
			}
			if n := tool.ServerRestarts() - restarts; n != 1 {
				t.Errorf("tool.ServerRestarts grew by %d, want 1", n)
			}
		})
	}
}

// TestAnsweredCancelKeepsTheServer: a server that answers a cancelled call
// within the kill grace (the Go SDK answers every request) is kept, even
// with RestartOnIgnoredCancel.
func TestAnsweredCancelKeepsTheServer(t *testing.T) {
	s, _ := openStubborn(t, true)
	ctx := context.Background()
	x, _ := call(ctx, t, s, "echo", `{}`, budget.ToolBudget{})
	first := output(x)
	cctx, cancel := context.WithCancelCause(ctx)
	// Cancelled once the server runs it (its first report): a cancel that
	// reaches the server before the call is a cancel it cannot act on.
	var once sync.Once
	started := func(tool.Report) {
		once.Do(func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the test"}) })
	}
	tl := find(t, s, "polite")
	x = tool.Run(cctx, tl, &tool.Call{ID: "call_polite", Tool: tl.Spec().Name, Input: []byte(`{}`)}, tb(time.Minute, 0),
		tool.Hooks{OnProgress: started})
	wantOutcome(t, x, event.OutcomeCancelled, budget.PhaseCancel)
	if x.Result != nil && x.Result.ServerRestarted {
		t.Error("a server that answered the cancel was restarted")
	}
	x, _ = call(ctx, t, s, "echo", `{}`, budget.ToolBudget{})
	if output(x) != first || s.Stats().IgnoredCancelRestarts != 0 {
		t.Errorf("echo answered by pid %s (first %s): want the same server", output(x), first)
	}
}

// TestAReplyBeforeItsCancelIsAnAnswer: a server whose reply comes after
// the call was stopped but before its notifications/cancelled went out
// (the SDK writes it from a goroutine of its own, a moment later) has
// answered the call. With RestartOnIgnoredCancel it is kept, not killed
// kill_grace later for a cancel it "ignored"; without, the record does not
// say its work may go on. The test holds the cancellation until the reply
// has been read, which makes the moment's race certain. (The reply was
// counted only after a written cancel: the server was restarted, and the
// kept one's call said its work may go on.)
func TestAReplyBeforeItsCancelIsAnAnswer(t *testing.T) {
	for _, restart := range []bool{true, false} {
		t.Run("restart="+strconv.FormatBool(restart), func(t *testing.T) {
			noLeftovers(t)
			t.Setenv(mcptest.EnvServe, "1")
			replied := make(chan struct{})
			var once sync.Once
			s, err := Open(context.Background(), Config{Name: "slow", Command: mcptest.Command(), Budget: tb(10*time.Second, 0),
				KeepAlive: -1, RestartOnIgnoredCancel: restart,
				onRead: func(m jsonrpc.Message) {
					if r, ok := m.(*jsonrpc.Response); ok && strings.Contains(string(r.Result), `"text":"late"`) {
						once.Do(func() { close(replied) })
					}
				},
				onCancel: func(string, time.Time) {
					select {
					case <-replied:
					case <-time.After(5 * time.Second):
						t.Error("the reply did not come")
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			x, _ := call(context.Background(), t, s, "late", `{"ms": 600}`, tb(300*time.Millisecond, 0))
			wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
			if x.Result != nil && (x.Result.ServerRestarted || x.Result.StopUnconfirmed) {
				t.Errorf("result %+v: the server had answered", x.Result)
			}
			st := s.Stats()
			if st.IgnoredCancelRestarts != 0 || st.Starts != 1 || st.LateReplies != 1 {
				t.Errorf("stats %+v: want no restart, one start, one late reply", st)
			}
		})
	}
}
