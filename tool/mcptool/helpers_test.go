package mcptool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/mcptest"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/tool"
)

// markerVar marks every process the tests start (the servers inherit the
// test's environment), so that leftovers can be found in /proc.
const markerVar = "TIMEBOX_MCPTOOL_TEST"

func TestMain(m *testing.M) {
	if mcptest.Serving() { // re-executed as a test server
		mcptest.Serve()
	}
	os.Setenv(markerVar, strconv.Itoa(os.Getpid()))
	goleak.VerifyTestMain(m)
}

// marked returns the pids of live processes that carry this test binary's
// marker.
func marked() []int {
	want := []byte(markerVar + "=" + strconv.Itoa(os.Getpid()) + "\x00")
	self := os.Getpid()
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile(d + "/environ")
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if stat, err := os.ReadFile(d + "/stat"); err == nil {
			// A zombie has exited; its parent will reap it.
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		out = append(out, pid)
	}
	return out
}

// noLeftovers fails the test if a process it started is still alive when
// it ends. Register it first, so that it runs after every other cleanup.
func noLeftovers(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		// Every server tree carries proctree's marker; the test's own
		// processes (an HTTP server it starts) carry markerVar.
		proctest.CheckNoLeaks(t)
		deadline := time.Now().Add(2 * time.Second)
		for {
			left := marked()
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				for _, pid := range left {
					cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					t.Errorf("process %d outlived the test: %s", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
				}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

const knob = "tools[everything].timeout in agent.yaml"

// tb is a tool budget: timeout, idle timeout (0 = off), hard enforcement.
func tb(timeout, idle time.Duration) budget.ToolBudget {
	return budget.ToolBudget{
		Timeout:     budget.Duration{D: timeout, Source: budget.SourceTool, Knob: knob},
		IdleTimeout: budget.Duration{D: idle, Source: budget.SourceTool, Knob: "tools[everything].idle_timeout in agent.yaml"},
		Enforcement: budget.Hard,
		KillGrace:   budget.Duration{D: 500 * time.Millisecond},
	}
}

// reports collects a call's progress reports.
type reports struct {
	mu   sync.Mutex
	list []tool.Report
}

func (r *reports) add(x tool.Report) {
	r.mu.Lock()
	r.list = append(r.list, x)
	r.mu.Unlock()
}

func (r *reports) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.list)
}

// call runs one call of the named tool through tool.Run, as the turn loop
// does, under b (or the tool's own budget when b is zero).
func call(ctx context.Context, t *testing.T, s *Server, name, input string, b budget.ToolBudget) (*tool.Execution, *reports) {
	t.Helper()
	tl := find(t, s, name)
	if b.Timeout.D == 0 {
		b = tl.Budget()
	}
	r := &reports{}
	c := &tool.Call{ID: "call_" + name, TurnID: "turn", Tool: tl.Spec().Name, Input: json.RawMessage(input), MaxOutput: 1 << 20}
	x := tool.Run(ctx, tl, c, b, tool.Hooks{OnProgress: r.add})
	return x, r
}

func find(t *testing.T, s *Server, name string) *Tool {
	t.Helper()
	for _, tl := range s.Tools() {
		if tl.RemoteName() == name || tl.Spec().Name == name {
			return tl
		}
	}
	t.Fatalf("server %s has no tool %q", s.Name(), name)
	return nil
}

func output(x *tool.Execution) string {
	if x.Result == nil {
		return ""
	}
	return string(x.Result.Output)
}

// wantOutcome checks an execution's outcome and phase.
func wantOutcome(t *testing.T, x *tool.Execution, o event.Outcome, p budget.Phase) {
	t.Helper()
	if x.Outcome != o || x.Phase != p {
		t.Fatalf("outcome %s phase %q (err %v, cause %v, output %q), want %s phase %q",
			x.Outcome, x.Phase, x.Err, x.Cause, output(x), o, p)
	}
}

// near checks that got is within [want, want+slack].
func near(t *testing.T, what string, got, want, slack time.Duration) {
	t.Helper()
	if got < want || got > want+slack {
		t.Errorf("%s = %s, want %s (+%s at most)", what, got, want, slack)
	}
}
