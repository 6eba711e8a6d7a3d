package mcptool

// Fast, deterministic tests against an in-process MCP server (the Go SDK's,
// over its in-memory transport): the cancellation and late-message logic,
// crashes, hangs and restarts.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/tool"
)

// fake is an in-process MCP server. Each dial connects a new session, as a
// restarted process would be.
type fake struct {
	srv *mcp.Server

	mu       sync.Mutex
	received []received // what the server read, in order
	conns    []*sniffConn
	dials    int
	dialErr  error
	frozen   bool
	release  chan struct{} // closed to let "stubborn" calls finish
	// unblocked has the times "block" calls saw their cancellation.
	unblocked []time.Time
}

type received struct {
	method string
	params json.RawMessage
	at     time.Time
}

type progressArgs struct {
	N       int  `json:"n"`
	EveryMS int  `json:"every_ms"`
	Stay    bool `json:"stay"` // ignore cancellation
}

func newFake() *fake {
	f := &fake{srv: mcp.NewServer(&mcp.Implementation{Name: "fake", Version: "1"}, nil), release: make(chan struct{})}
	schema := func(props string) json.RawMessage {
		return json.RawMessage(`{"type":"object","properties":{` + props + `}}`)
	}
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	f.srv.AddTool(&mcp.Tool{Name: "echo", Description: "Echoes its text.", InputSchema: schema(`"text":{"type":"string"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a struct{ Text string }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return text(a.Text), nil
		})
	// progress sends n progress notifications, every every_ms, and returns
	// right after the last one: the last notification races the reply. With
	// stay it ignores cancellation and goes on, then returns anyway.
	f.srv.AddTool(&mcp.Tool{Name: "progress", InputSchema: schema(`"n":{"type":"integer"},"every_ms":{"type":"integer"},"stay":{"type":"boolean"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a progressArgs
			_ = json.Unmarshal(req.Params.Arguments, &a)
			token := req.Params.GetProgressToken()
			for i := 1; i <= a.N; i++ {
				if a.EveryMS > 0 {
					select {
					case <-time.After(time.Duration(a.EveryMS) * time.Millisecond):
					case <-ctx.Done():
						if !a.Stay {
							return nil, ctx.Err()
						}
						<-time.After(time.Duration(a.EveryMS) * time.Millisecond)
					}
				}
				if token != nil {
					_ = req.Session.NotifyProgress(context.WithoutCancel(ctx), &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i), Total: float64(a.N), Message: fmt.Sprintf("step %d", i)})
				}
			}
			return text(fmt.Sprintf("done after %d steps", a.N)), nil
		})
	// block waits for its cancellation.
	f.srv.AddTool(&mcp.Tool{Name: "block", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			<-ctx.Done()
			f.mu.Lock()
			f.unblocked = append(f.unblocked, time.Now())
			f.mu.Unlock()
			return nil, ctx.Err()
		})
	// stubborn ignores cancellation until the test releases it, then
	// replies.
	f.srv.AddTool(&mcp.Tool{Name: "stubborn", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			<-f.release
			return text("finally"), nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "fail", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "disk full"}}}, nil
		})
	f.srv.AddTool(&mcp.Tool{Name: "protocol", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no such thing"}
		})
	// crash drops the connection mid-call, as a dying process would.
	f.srv.AddTool(&mcp.Tool{Name: "crash", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			time.Sleep(50 * time.Millisecond)
			f.mu.Lock()
			c := f.conns[len(f.conns)-1]
			f.mu.Unlock()
			_ = c.Close()
			<-ctx.Done()
			return nil, ctx.Err()
		})
	// freeze makes the server stop reading: from now on it answers nothing,
	// pings included.
	f.srv.AddTool(&mcp.Tool{Name: "freeze", InputSchema: schema("")},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			f.mu.Lock()
			f.frozen = true
			f.mu.Unlock()
			<-ctx.Done()
			return nil, ctx.Err()
		})
	return f
}

func (f *fake) dial(ctx context.Context) (mcp.Transport, error) {
	f.mu.Lock()
	f.dials++
	err := f.dialErr
	f.frozen = false
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ct, st := mcp.NewInMemoryTransports()
	if _, err := f.srv.Connect(ctx, &sniffTransport{t: st, f: f}, nil); err != nil {
		return nil, err
	}
	return ct, nil
}

// cancels returns the cancellations the server received.
func (f *fake) cancels() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []received
	for _, r := range f.received {
		if r.method == methodCancelled {
			out = append(out, r)
		}
	}
	return out
}

type sniffTransport struct {
	t mcp.Transport
	f *fake
}

func (s *sniffTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := s.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc := &sniffConn{Connection: c, f: s.f}
	s.f.mu.Lock()
	s.f.conns = append(s.f.conns, sc)
	s.f.mu.Unlock()
	return sc, nil
}

// sniffConn is the server's side of the connection: it records what the
// server reads, and while the fake is frozen swallows it all.
type sniffConn struct {
	mcp.Connection
	f *fake
}

func (c *sniffConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if err != nil {
			return msg, err
		}
		c.f.mu.Lock()
		frozen := c.f.frozen
		if req, ok := msg.(*jsonrpc.Request); ok {
			c.f.received = append(c.f.received, received{req.Method, req.Params, time.Now()})
		}
		c.f.mu.Unlock()
		if !frozen {
			return msg, nil
		}
	}
}

// openFake opens a Server on f with short budgets.
func openFake(t *testing.T, f *fake, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{Name: "fake", Budget: tb(5*time.Second, 0), dial: f.dial, KeepAlive: -1}
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

// TestFinalProgressIsNeverLost: the last progress notification is written
// just before the reply; it must be reported before the call returns, every
// time.
func TestFinalProgressIsNeverLost(t *testing.T) {
	s := openFake(t, newFake(), nil)
	for i := range 200 {
		x, r := call(context.Background(), t, s, "progress", `{"n": 3}`, tb(5*time.Second, 0))
		wantOutcome(t, x, event.OutcomeOK, "")
		if r.len() != 3 || x.Progress != 3 {
			t.Fatalf("run %d: %d progress reports reached the hook, %d the record; want 3", i, r.len(), x.Progress)
		}
	}
	if st := s.Stats(); st.LateProgress != 0 {
		t.Errorf("late progress %d, want 0", st.LateProgress)
	}
}

func TestProgressReports(t *testing.T) {
	s := openFake(t, newFake(), nil)
	x, r := call(context.Background(), t, s, "progress", `{"n": 4, "every_ms": 10}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if output(x) != "done after 4 steps" {
		t.Errorf("output %q", output(x))
	}
	last := r.list[len(r.list)-1]
	if *last.Progress != 4 || *last.Total != 4 || last.Message != "step 4" {
		t.Errorf("last report %+v", last)
	}
}

// TestTimeoutWithoutProgress: a call that never reports progress is stopped
// at its timeout, not later; the cancellation goes out at that moment,
// naming the timeout; the server sees it. (In a synctest bubble, so "at that
// moment" is exact.)
func TestTimeoutWithoutProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		var sentAt time.Time
		s := openFake(t, f, func(c *Config) {
			c.onCancel = func(_ string, at time.Time) { sentAt = at }
		})
		x, _ := call(context.Background(), t, s, "block", `{}`, tb(time.Second, 0))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
		synctest.Wait()
		if x.Elapsed() != time.Second || sentAt.Sub(x.Started) != time.Second {
			t.Errorf("stopped after %s, cancellation sent after %s; want both at 1s", x.Elapsed(), sentAt.Sub(x.Started))
		}
		c := f.cancels()
		if len(c) != 1 || c[0].at.Sub(x.Started) != time.Second {
			t.Fatalf("the server received cancellations %v", c)
		}
		var p mcp.CancelledParams
		if err := json.Unmarshal(c[0].params, &p); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p.Reason, "tool timeout") || !strings.Contains(p.Reason, "exceeded 1s") {
			t.Errorf("cancellation reason %q does not name the timeout", p.Reason)
		}
		f.mu.Lock()
		unblocked := f.unblocked
		f.mu.Unlock()
		if len(unblocked) != 1 || unblocked[0].Sub(x.Started) != time.Second {
			t.Errorf("the server's handler was cancelled at %v", unblocked)
		}
		if st := s.Stats(); st.CancelsSent != 1 {
			t.Errorf("stats %+v, want 1 cancellation sent", st)
		}
	})
}

// TestTimeoutWhileProgressing: progress resets the idle window but never
// extends the timeout.
func TestTimeoutWhileProgressing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openFake(t, newFake(), nil)
		x, r := call(context.Background(), t, s, "progress", `{"n": 100, "every_ms": 300}`, tb(10*time.Second, 500*time.Millisecond))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
		if x.Elapsed() != 10*time.Second || r.len() != 33 {
			t.Errorf("stopped after %s with %d progress reports; want 10s and 33", x.Elapsed(), r.len())
		}
	})
}

func TestIdleStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openFake(t, newFake(), nil)
		x, r := call(context.Background(), t, s, "progress", `{"n": 5, "every_ms": 400}`, tb(time.Minute, 500*time.Millisecond))
		wantOutcome(t, x, event.OutcomeOK, "") // every report came inside the idle window
		if r.len() != 5 || x.Elapsed() != 2*time.Second {
			t.Errorf("%d reports in %s", r.len(), x.Elapsed())
		}
		x, r = call(context.Background(), t, s, "progress", `{"n": 5, "every_ms": 400}`, tb(time.Minute, 300*time.Millisecond))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseToolIdle)
		if r.len() != 0 || x.Elapsed() != 300*time.Millisecond {
			t.Errorf("%d reports, stopped after %s; want none, at 300ms", r.len(), x.Elapsed())
		}
	})
}

// TestUserCancelIsCancelled: a cancelled turn stops the call as cancelled,
// never as a timeout, and the server is told why.
func TestUserCancelIsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		s := openFake(t, f, nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		time.AfterFunc(100*time.Millisecond, func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the client"}) })
		x, _ := call(ctx, t, s, "block", `{}`, tb(time.Second, 0))
		wantOutcome(t, x, event.OutcomeCancelled, budget.PhaseCancel)
		if _, ok := budget.AsCancel(x.Cause); !ok {
			t.Errorf("cause %v, want a *budget.CancelError", x.Cause)
		}
		if x.Elapsed() != 100*time.Millisecond {
			t.Errorf("stopped after %s, want 100ms", x.Elapsed())
		}
		synctest.Wait()
		c := f.cancels()
		if len(c) != 1 {
			t.Fatalf("the server received %d cancellations", len(c))
		}
		var p mcp.CancelledParams
		_ = json.Unmarshal(c[0].params, &p)
		if p.Reason != "cancelled by the client" {
			t.Errorf("reason %q", p.Reason)
		}
		// The same server answers the next call.
		x, _ = call(context.Background(), t, s, "echo", `{"text": "still here"}`, tb(time.Second, 0))
		wantOutcome(t, x, event.OutcomeOK, "")
	})
}

// TestLateMessagesDroppedQuietly: a server that ignores the cancellation
// keeps sending progress and finally replies; all of it is dropped and
// counted, and none of it is an error.
func TestLateMessagesDroppedQuietly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openFake(t, newFake(), nil)
		x, r := call(context.Background(), t, s, "progress", `{"n": 6, "every_ms": 60, "stay": true}`, tb(200*time.Millisecond, 0))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
		if r.len() != 3 {
			t.Errorf("%d progress reports before the timeout, want 3", r.len())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if st := s.Stats(); st.LateProgress != 3 || st.LateReplies != 1 {
			t.Errorf("stats %+v, want 3 late progress notifications and 1 late reply", st)
		}
		if r.len() != 3 {
			t.Errorf("progress reached the ended call: %d reports", r.len())
		}
		x, _ = call(context.Background(), t, s, "echo", `{"text": "ok"}`, tb(time.Second, 0))
		wantOutcome(t, x, event.OutcomeOK, "")
	})
}

// TestStuckCallDoesNotBlockOthers: a call the server will not give up does
// not hold up other calls to the same server.
func TestStuckCallDoesNotBlockOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		s := openFake(t, f, nil)
		defer close(f.release)
		x, _ := call(context.Background(), t, s, "stubborn", `{}`, tb(time.Minute, 0))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				x, _ := call(context.Background(), t, s, "echo", fmt.Sprintf(`{"text": "%d"}`, i), tb(time.Second, 0))
				if x.Outcome != event.OutcomeOK || x.Elapsed() != 0 {
					t.Errorf("call %d: %s after %s", i, x.Outcome, x.Elapsed())
				}
			})
		}
		wg.Wait()
	})
}

func TestErrors(t *testing.T) {
	s := openFake(t, newFake(), nil)
	cases := []struct {
		tool, input, want string
	}{
		{"fail", `{}`, "disk full"},
		{"protocol", `{}`, `refused the call to "protocol": no such thing (JSON-RPC error -32602)`},
	}
	for _, tc := range cases {
		t.Run(tc.tool, func(t *testing.T) {
			x, _ := call(context.Background(), t, s, tc.tool, tc.input, tb(time.Second, 0))
			wantOutcome(t, x, event.OutcomeError, "")
			var te *tool.Error
			if !errors.As(x.Err, &te) || !strings.Contains(te.Message, tc.want) {
				t.Errorf("error %v, want a *tool.Error containing %q", x.Err, tc.want)
			}
			res := tool.ModelResult("fake__"+tc.tool, tb(time.Second, 0), x)
			if !strings.Contains(res, `"type":"tool_error"`) {
				t.Errorf("model result %s", res)
			}
		})
	}
}

// TestCrashMidCall: the connection drops during a call; the call gets a
// tool error saying so, and the next call restarts the server.
func TestCrashMidCall(t *testing.T) {
	f := newFake()
	s := openFake(t, f, nil)
	x, _ := call(context.Background(), t, s, "crash", `{}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	if !strings.Contains(x.Err.Error(), "during the call") || !strings.Contains(x.Err.Error(), "restart") {
		t.Errorf("error %q does not say what happened", x.Err)
	}
	if x.Elapsed() > time.Second {
		t.Errorf("the crash took %s to surface", x.Elapsed())
	}
	x, _ = call(context.Background(), t, s, "echo", `{"text": "back"}`, tb(2*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 2 {
		t.Errorf("starts %d, want 2", st.Starts)
	}
}

// TestHungServer: a server that stops answering, pings included, while a
// call runs is left to the call's own budget, which stops the call at its
// deadline, not at the second unanswered ping (a server whose tool blocks
// its event loop answers no ping, and is busy); once no call runs, two
// unanswered pings mean it is hung, and it is replaced before the next call.
func TestHungServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		s := openFake(t, f, func(c *Config) { c.KeepAlive = 10 * time.Second })
		x, _ := call(context.Background(), t, s, "freeze", `{}`, tb(time.Minute, 0))
		wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
		if x.Elapsed() != time.Minute {
			t.Errorf("the call ended after %s, want its timeout, 1m (pings went unanswered from 15s)", x.Elapsed())
		}
		if st := s.Stats(); st.Starts != 1 {
			t.Errorf("starts %d while the call ran", st.Starts)
		}
		// No call runs now: the pings at 70s and 80s go unanswered, and
		// at 85s the server is stopped.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		s.mu.Lock()
		down, why := s.cur == nil, fmt.Sprint(s.lastErr)
		s.mu.Unlock()
		if !down || !strings.Contains(why, "stopped answering (2 pings in a row went unanswered for 5s each)") {
			t.Errorf("30s after the call the server is down: %v (%s)", down, why)
		}
		x, _ = call(context.Background(), t, s, "echo", `{"text": "back"}`, tb(2*time.Second, 0))
		wantOutcome(t, x, event.OutcomeOK, "")
		if st := s.Stats(); st.Starts != 2 {
			t.Errorf("starts %d, want 2", st.Starts)
		}
	})
}

// TestRestartBackoff: a server that cannot be restarted is retried with
// backoff; a call that cannot wait for the next attempt fails at once,
// saying when it is.
func TestRestartBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		s := openFake(t, f, nil)
		f.mu.Lock()
		f.dialErr = errors.New("no such server")
		f.mu.Unlock()
		x, _ := call(context.Background(), t, s, "crash", `{}`, tb(5*time.Second, 0))
		wantOutcome(t, x, event.OutcomeError, "")

		// First restart: immediate, fails.
		x, _ = call(context.Background(), t, s, "echo", `{}`, tb(time.Second, 0))
		wantOutcome(t, x, event.OutcomeError, "")
		if !strings.Contains(x.Err.Error(), "could not be restarted") || !strings.Contains(x.Err.Error(), "no such server") {
			t.Errorf("error %q", x.Err)
		}
		// The next attempt is 1s away, past a 500ms call's deadline: the
		// call fails at once.
		x, _ = call(context.Background(), t, s, "echo", `{}`, tb(500*time.Millisecond, 0))
		wantOutcome(t, x, event.OutcomeError, "")
		if !strings.Contains(x.Err.Error(), "the next attempt is in 1s") || x.Elapsed() != 0 {
			t.Errorf("error %q after %s, want an immediate refusal naming the next attempt", x.Err, x.Elapsed())
		}
		// A call with room waits for the attempt, which fails again; the
		// next is 2s later.
		x, _ = call(context.Background(), t, s, "echo", `{}`, tb(3*time.Second, 0))
		wantOutcome(t, x, event.OutcomeError, "")
		if x.Elapsed() != time.Second {
			t.Errorf("the call waited %s for the attempt, want 1s", x.Elapsed())
		}
		f.mu.Lock()
		f.dialErr = nil
		f.mu.Unlock()
		x, _ = call(context.Background(), t, s, "echo", `{"text": "back"}`, tb(3*time.Second, 0))
		wantOutcome(t, x, event.OutcomeOK, "")
		if x.Elapsed() != 2*time.Second {
			t.Errorf("the call waited %s for the attempt, want 2s", x.Elapsed())
		}
	})
}

func TestOverridesAndNames(t *testing.T) {
	ov := Override{Timeout: budget.Duration{D: 30 * time.Second, Source: budget.SourceTool, Knob: "tools[fake].overrides[progress].timeout in agent.yaml"},
		IdleTimeout: budget.Duration{D: 5 * time.Second, Source: budget.SourceTool}, Enforcement: budget.Advisory}
	s := openFake(t, newFake(), func(c *Config) { c.Overrides = map[string]Override{"progress": ov} })
	p, e := find(t, s, "progress").Budget(), find(t, s, "echo").Budget()
	if p.Timeout != ov.Timeout || p.IdleTimeout != ov.IdleTimeout || p.Enforcement != budget.Advisory {
		t.Errorf("progress budget %+v, want the override", p)
	}
	if e.Timeout.D != 5*time.Second || e.Enforcement != budget.Hard {
		t.Errorf("echo budget %+v, want the entry's", e)
	}
	tl := find(t, s, "echo")
	if tl.Spec().Name != "fake__echo" || tl.Spec().Description != "Echoes its text." || tl.Kind() != tool.KindMCP {
		t.Errorf("spec %+v kind %s", tl.Spec(), tl.Kind())
	}
	if !strings.Contains(string(tl.Spec().InputSchema), `"text"`) {
		t.Errorf("schema %s", tl.Spec().InputSchema)
	}

	_, err := Open(context.Background(), Config{Name: "fake", Budget: tb(time.Second, 0), dial: newFake().dial, KeepAlive: -1,
		Overrides: map[string]Override{"progres": ov}})
	if err == nil || !strings.Contains(err.Error(), "overrides[progres] names no tool of the server (did you mean progress?)") {
		t.Errorf("Open with a misspelt override: %v", err)
	}
}

func TestCloseFailsLaterCalls(t *testing.T) {
	s := openFake(t, newFake(), nil)
	s.Close()
	s.Close() // idempotent
	x, _ := call(context.Background(), t, s, "echo", `{}`, tb(time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
}

// TestCloseDuringCall: closing the server fails a call in flight with a
// tool error that says why, within the kill grace.
func TestCloseDuringCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openFake(t, newFake(), nil)
		time.AfterFunc(100*time.Millisecond, func() { s.Close() })
		x, _ := call(context.Background(), t, s, "block", `{}`, tb(5*time.Second, 0))
		wantOutcome(t, x, event.OutcomeError, "")
		if !strings.Contains(x.Err.Error(), "was shut down during the call") {
			t.Errorf("error %q", x.Err)
		}
		// Close waits the kill grace (500ms) for the call, then cuts it.
		if x.Elapsed() != 600*time.Millisecond {
			t.Errorf("the call ended after %s, want 600ms", x.Elapsed())
		}
	})
}

func TestToolNames(t *testing.T) {
	long := strings.Repeat("x", 70)
	cases := []struct {
		entry  string
		remote []string
		want   []string
	}{
		{"everything", []string{"echo", "get-sum"}, []string{"everything__echo", "everything__get-sum"}},
		{"fs", []string{"read.file", "read file"}, []string{"fs__read_file", "fs__read_file_" + hash8("read file")}},
		{"e", []string{long}, []string{("e__" + long)[:55] + "_" + hash8(long)}},
		{"e", []string{"ünïcode"}, []string{"e___n_code"}},
	}
	for _, tc := range cases {
		got := toolNames(tc.entry, tc.remote)
		for i := range got {
			if got[i] != tc.want[i] || len(got[i]) > 64 {
				t.Errorf("toolNames(%q, %q)[%d] = %q, want %q", tc.entry, tc.remote, i, got[i], tc.want[i])
			}
		}
	}
}

func hash8(s string) string { return withHash("", s)[1:] }

func TestInputSchema(t *testing.T) {
	raw, warn := inputSchema(map[string]any{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
		"properties": map[string]any{"a": map[string]any{"type": "number"}}})
	if warn != "" || !strings.Contains(string(raw), `"a"`) {
		t.Errorf("a draft-07 schema: %s, %q", raw, warn)
	}
	raw, warn = inputSchema(map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"$ref": "#/nowhere"}}})
	if warn == "" || string(raw) != `{"type":"object"}` {
		t.Errorf("a broken schema: %s, %q", raw, warn)
	}
}

// TestCancelWrittenBeforeClose: a call stopped at its deadline, then the
// server closed at once (the turn ended), still sends the server its
// notifications/cancelled: the SDK writes it after CallTool returned, and
// a Close right after cut it off about one time in three.
func TestCancelWrittenBeforeClose(t *testing.T) {
	for i := range 20 {
		f := newFake()
		cfg := Config{Name: "fake", Budget: tb(5*time.Second, 0), dial: f.dial, KeepAlive: -1}
		s, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := call(context.Background(), t, s, "block", `{}`, tb(20*time.Millisecond, 0))
		s.Close()
		if x.Outcome != event.OutcomeTimedOut {
			t.Fatalf("round %d: outcome %s", i, x.Outcome)
		}
		// The server reads what was written on its own time.
		if !wait.Until(2*time.Second, func() bool { return len(f.cancels()) == 1 }) {
			t.Fatalf("round %d: the server received %d cancellations, want 1", i, len(f.cancels()))
		}
	}
}

// TestAKeptServerMayGoOn: a call stopped at its deadline on a server that
// is kept (mcp.on_ignored_cancel: keep, the default) tells the model that
// it was asked to stop and its work may go on, not that it "was stopped":
// MCP lets a server go on with a cancelled call, and timebox did not wait.
func TestAKeptServerMayGoOn(t *testing.T) {
	s := openFake(t, newFake(), nil)
	b := tb(50*time.Millisecond, 0)
	x, _ := call(context.Background(), t, s, "block", `{}`, b)
	wantOutcome(t, x, event.OutcomeTimedOut, budget.PhaseTool)
	res := tool.ModelResult("fake__block", b, x)
	if !strings.Contains(res, `did not finish within 50ms, and was asked to stop. Its work may still go on: check before asking for it again.`) {
		t.Errorf("result %s", res)
	}
}
