package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
)

// TestClientGoneStopsToolProcesses is the whole path with a real
// subprocess tool: a client drops its stream while the tool (a shell with
// a child and a setsid grandchild) runs, and within a second every process
// of the call is gone and the record says client_gone.
func TestClientGoneStopsToolProcesses(t *testing.T) {
	proctest.AfterTest(t)
	crawl, err := exectool.New(exectool.Config{
		Spec: tool.Spec{Name: "crawl", Description: "crawls"},
		// Report progress once both children have become sleep.
		Argv: []string{"/bin/sh", "-c", `sleep 60 & a=$!; setsid sleep 60 & b=$!
for p in $a $b; do until read -r c < /proc/$p/comm && [ "$c" = sleep ]; do :; done; done
echo '::progress:: {"message": "started"}' >&2; wait`},
	})
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, scripted(t, `{"tool_calls": [{"name": "crawl", "arguments": {}}]}`, `{"text": "never"}`),
		agent.Tool{Tool: crawl, Budget: budget.ToolBudget{Timeout: budget.Duration{D: time.Minute, Source: budget.SourceTool},
			Enforcement: budget.Hard, KillGrace: budget.Duration{D: 2 * time.Second}}})
	e := newEnv(t, server.Config{Agent: a})
	ctx, drop := context.WithCancel(t.Context())
	resp, sse := e.stream(ctx, map[string]any{"input": "crawl it"})
	id := resp.Header.Get(server.HeaderTurnID)
	sse.until(t, "tool_progress") // the tool and its children are running
	// A process whose comm is already sleep may still be in its execve,
	// its environment (and so its marker) not set up yet: wait for it.
	wait.For(t, 5*time.Second, "the shell and two sleeps to be listed", func() bool { return len(proctest.Leaks(0)) >= 3 })
	dropped := time.Now()
	drop()
	resp.Body.Close()

	if left := proctest.Leaks(time.Second); len(left) > 0 {
		t.Fatalf("a second after the client left, these still run:\n%v", left)
	}
	wait.For(t, time.Second-time.Since(dropped)+100*time.Millisecond, "the record saying client_gone", func() bool {
		st, r := e.storedStatus(id)
		return st == budget.StatusCancelled && r == budget.ClientGone
	})
	t.Logf("tool processes gone and record stored %s after the client left", time.Since(dropped).Round(time.Millisecond))
	rec := e.record(id)
	if tc := rec.ToolCalls[0]; tc.Outcome != "cancelled" || tc.Phase != budget.PhaseCancel || tc.Kind != "exec" {
		t.Fatalf("tool record %+v", tc)
	}
}
