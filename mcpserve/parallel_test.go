//go:build linux

package mcpserve_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/mcpserve"
)

// TestParallelLimitsAClientsCalls: with Parallel 1, a client's second call
// waits for its first to end and its budget starts when it runs; another
// client's call does not wait; a call cancelled while it waits is
// answered without running and is not recorded.
func TestParallelLimitsAClientsCalls(t *testing.T) {
	proctest.AfterTest(t)
	dir, a := openAgent(t)
	fin := make(chan mcpserve.Finished, 8)
	s, err := mcpserve.New(a.Tools(), mcpserve.Options{Parallel: 1, OnFinished: func(f mcpserve.Finished) { fin <- f }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	connect := func() (*mcp.ClientSession, chan error) {
		st, ct := mcp.NewInMemoryTransports()
		served := make(chan error, 1)
		go func() { served <- s.Serve(ctx, st) }()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil).Connect(context.Background(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs, served
	}
	a1, served1 := connect()
	b1, served2 := connect()
	defer func() {
		a1.Close()
		b1.Close()
		<-served1
		<-served2
	}()
	call := func(ctx context.Context, cs *mcp.ClientSession, name string) chan *mcp.CallToolResult {
		got := make(chan *mcp.CallToolResult, 1)
		go func() {
			r, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
			got <- r
		}()
		return got
	}

	// A's slot is taken by a hung call.
	hangCtx, stopHang := context.WithCancel(context.Background())
	hang := call(hangCtx, a1, "slow_hang")
	if !wait.Until(10*time.Second, func() bool { return strings.Count(readPids(dir), "\n") >= 2 }) {
		t.Fatal("the hung call never started")
	}
	// B runs at once.
	select {
	case r := <-call(context.Background(), b1, "fast"):
		if r == nil || r.IsError {
			t.Fatalf("B's call: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another client's call waited for A's slot")
	}
	if f := <-fin; f.Tool != "fast" {
		t.Fatalf("finished %s, want B's fast", f.Tool)
	}
	// A's second call waits; cancelled while it waits, it is not run.
	waitCtx, cancelWait := context.WithCancel(context.Background())
	waiting := call(waitCtx, a1, "fast")
	cancelWait()
	<-waiting
	// A's third call waits, then runs when the hung call is cancelled.
	third := call(context.Background(), a1, "fast")
	stopHang()
	<-hang
	var hung, fast mcpserve.Finished
	for range 2 {
		select {
		case f := <-fin:
			if f.Tool == "slow_hang" {
				hung = f
			} else {
				fast = f
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the calls did not finish")
		}
	}
	if r := <-third; r == nil || r.IsError {
		t.Fatalf("A's third call: %+v", r)
	}
	if hung.Execution == nil || hung.Execution.Outcome != event.OutcomeCancelled || fast.Execution == nil {
		t.Fatalf("finished %+v and %+v", hung, fast)
	}
	if fast.Execution.Started.Before(hung.Execution.Ended) {
		t.Errorf("A's third call started at %v, before its first ended at %v", fast.Execution.Started, hung.Execution.Ended)
	}
	if fast.Execution.Elapsed() > 5*time.Second {
		t.Errorf("A's third call took %v: its wait counted", fast.Execution.Elapsed())
	}
	select {
	case f := <-fin:
		t.Errorf("the call cancelled while it waited ran: %s", f.Tool)
	default:
	}
	checkDead(t, dir)
}
