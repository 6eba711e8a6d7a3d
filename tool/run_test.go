package tool_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tb(timeout time.Duration, e budget.Enforcement) budget.ToolBudget {
	return budget.ToolBudget{Timeout: budget.Duration{D: timeout, Source: budget.SourceTool, Knob: "tools[t].timeout in agent.yaml"},
		Enforcement: e, KillGrace: budget.Duration{D: 2 * time.Second}}
}

// fake is a tool whose kind and body a test chooses.
type fake struct {
	kind tool.Kind
	fn   func(ctx context.Context, c *tool.Call) (*tool.Result, error)
}

func (f fake) Spec() tool.Spec { return tool.Spec{Name: "t"} }
func (f fake) Kind() tool.Kind { return f.kind }
func (f fake) Call(ctx context.Context, c *tool.Call) (*tool.Result, error) {
	return f.fn(ctx, c)
}

// owner is a fake that, like an exec tool, stops what it started before
// its Call returns (tool.ProcessOwner).
type owner struct{ fake }

func (owner) OwnsProcesses() {}

func TestRunOutcomes(t *testing.T) {
	cases := []struct {
		name      string
		b         budget.ToolBudget
		kind      tool.Kind
		owns      bool // the tool is a tool.ProcessOwner
		fn        func(ctx context.Context, c *tool.Call) (*tool.Result, error)
		cancelAt  time.Duration // cancel the parent at this time, with a CancelError
		outcome   event.Outcome
		phase     budget.Phase
		elapsed   time.Duration
		overran   bool
		abandoned bool
	}{
		{name: "ok", b: tb(time.Second, budget.Cooperative),
			fn: func(context.Context, *tool.Call) (*tool.Result, error) {
				time.Sleep(500 * time.Millisecond)
				return &tool.Result{Output: []byte("x")}, nil
			}, outcome: event.OutcomeOK, elapsed: 500 * time.Millisecond},
		{name: "tool's own error", b: tb(time.Second, budget.Cooperative),
			fn: func(context.Context, *tool.Call) (*tool.Result, error) {
				return nil, &tool.Error{Message: "nope"}
			}, outcome: event.OutcomeError},
		{name: "stops at its deadline", b: tb(time.Second, budget.Cooperative),
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				<-ctx.Done()
				return &tool.Result{Output: []byte("part")}, context.Cause(ctx)
			}, outcome: event.OutcomeTimedOut, phase: budget.PhaseTool, elapsed: time.Second},
		{name: "error reported while stopping is still a timeout", b: tb(time.Second, budget.Hard), kind: tool.KindExec,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				<-ctx.Done()
				time.Sleep(300 * time.Millisecond) // SIGTERM handling
				return nil, errors.New("signal: terminated")
			}, outcome: event.OutcomeTimedOut, phase: budget.PhaseTool, elapsed: 1300 * time.Millisecond},
		{name: "cooperative that ignores cancel is abandoned after kill_grace", b: tb(time.Second, budget.Cooperative),
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				time.Sleep(time.Minute)
				return nil, nil
			}, outcome: event.OutcomeAbandoned, phase: budget.PhaseTool, elapsed: 3 * time.Second, abandoned: true},
		{name: "hard gets the reap margin too", b: tb(time.Second, budget.Hard), kind: tool.KindExec,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				time.Sleep(time.Minute)
				return nil, nil
			}, outcome: event.OutcomeAbandoned, phase: budget.PhaseTool, elapsed: 3*time.Second + tool.ReapMargin, abandoned: true},
		{name: "a process owner's hard call is waited for, never abandoned", b: tb(time.Second, budget.Hard), kind: tool.KindExec, owns: true,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				<-ctx.Done()
				time.Sleep(10 * time.Second) // the grace, SIGKILL, a slow kernel
				return &tool.Result{Output: []byte("part")}, context.Cause(ctx)
			}, outcome: event.OutcomeTimedOut, phase: budget.PhaseTool, elapsed: 11 * time.Second},
		{name: "a process owner's cancelled call is waited for too", b: tb(time.Minute, budget.Hard), kind: tool.KindExec, owns: true,
			cancelAt: time.Second,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				<-ctx.Done()
				time.Sleep(5 * time.Second)
				return nil, context.Cause(ctx)
			}, outcome: event.OutcomeCancelled, phase: budget.PhaseCancel, elapsed: 6 * time.Second},
		{name: "advisory is never stopped by its budget", b: tb(time.Second, budget.Advisory),
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				time.Sleep(5 * time.Second)
				return &tool.Result{Output: []byte("late but used")}, ctx.Err()
			}, outcome: event.OutcomeOK, elapsed: 5 * time.Second, overran: true},
		{name: "advisory still stops when the turn is cancelled", b: tb(time.Second, budget.Advisory), cancelAt: 4 * time.Second,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}, outcome: event.OutcomeCancelled, phase: budget.PhaseCancel, elapsed: 4 * time.Second, overran: true},
		{name: "a cancel gives a short grace", b: tb(time.Minute, budget.Cooperative), cancelAt: time.Second,
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				time.Sleep(time.Hour)
				return nil, nil
			}, outcome: event.OutcomeAbandoned, phase: budget.PhaseCancel, elapsed: time.Second + budget.CancelGrace, abandoned: true},
		{name: "finishing exactly at the deadline keeps the result", b: tb(time.Second, budget.Cooperative),
			fn: func(ctx context.Context, _ *tool.Call) (*tool.Result, error) {
				time.Sleep(time.Second)
				return &tool.Result{Output: []byte("made it")}, nil
			}, outcome: event.OutcomeOK, elapsed: time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				if tc.cancelAt > 0 {
					time.AfterFunc(tc.cancelAt, func() { cancel(&budget.CancelError{Reason: budget.Cancelled}) })
				}
				kind := tc.kind
				if kind == "" {
					kind = tool.KindGo
				}
				before := tool.AbandonedRunning()
				var tl tool.Tool = fake{kind, tc.fn}
				if tc.owns {
					tl = owner{fake{kind, tc.fn}}
				}
				x := tool.Run(ctx, tl, &tool.Call{Tool: "t"}, tc.b, tool.Hooks{})
				if x.Outcome != tc.outcome || x.Phase != tc.phase || x.Overran != tc.overran || x.Abandoned != tc.abandoned {
					t.Fatalf("got %s/%s overran=%v abandoned=%v, want %s/%s %v %v (err %v)", x.Outcome, x.Phase, x.Overran, x.Abandoned,
						tc.outcome, tc.phase, tc.overran, tc.abandoned, x.Err)
				}
				if tc.elapsed != 0 && x.Elapsed() != tc.elapsed {
					t.Fatalf("elapsed %s, want %s", x.Elapsed(), tc.elapsed)
				}
				if tc.abandoned {
					if n := tool.AbandonedRunning() - before; n != 1 {
						t.Fatalf("abandoned calls running: %d", n)
					}
					// Let the abandoned call return: it stops being counted.
					time.Sleep(2 * time.Hour)
					synctest.Wait()
					if n := tool.AbandonedRunning() - before; n != 0 {
						t.Fatalf("abandoned calls still counted after returning: %d", n)
					}
				}
				res := tool.ModelResult("t", tc.b, x)
				switch tc.outcome {
				case event.OutcomeTimedOut, event.OutcomeAbandoned:
					if tc.phase == budget.PhaseTool && !strings.Contains(res, `"type":"tool_timeout"`) {
						t.Fatalf("model result %s", res)
					}
				case event.OutcomeError:
					if !strings.Contains(res, `"type":"tool_error"`) || strings.Contains(res, "timeout") {
						t.Fatalf("model result %s", res)
					}
				}
			})
		})
	}
}

func TestProgressAfterEndIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var keep tool.Progress
		var mu sync.Mutex
		var got int
		x := tool.Run(t.Context(), fake{tool.KindGo, func(ctx context.Context, c *tool.Call) (*tool.Result, error) {
			keep = c.Progress
			c.Progress.Report(tool.Report{Message: "one"})
			return &tool.Result{}, nil
		}}, &tool.Call{Tool: "t"}, tb(time.Second, budget.Cooperative), tool.Hooks{OnProgress: func(tool.Report) {
			mu.Lock()
			got++
			mu.Unlock()
		}})
		keep.Report(tool.Report{Message: "late"}) // must not panic or count
		if x.Progress != 1 || got != 1 {
			t.Fatalf("progress %d, hook saw %d", x.Progress, got)
		}
	})
}

func TestIdleWindowResetsOnProgressButDeadlineDoesNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := tb(5*time.Second, budget.Cooperative)
		b.IdleTimeout = budget.Duration{D: time.Second, Source: budget.SourceTool, Knob: "tools[t].idle_timeout"}
		x := tool.Run(t.Context(), fake{tool.KindGo, func(ctx context.Context, c *tool.Call) (*tool.Result, error) {
			for {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(900 * time.Millisecond):
					c.Progress.Report(tool.Report{})
				}
			}
		}}, &tool.Call{Tool: "t"}, b, tool.Hooks{})
		if x.Phase != budget.PhaseTool || x.Elapsed() != 5*time.Second || x.Progress != 5 {
			t.Fatalf("phase %s after %s with %d reports", x.Phase, x.Elapsed(), x.Progress)
		}
	})
}

func TestOutputCapAndInvalidUTF8(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := append([]byte("ab\xff"), []byte(strings.Repeat("ü", 10))...)
		x := tool.Run(t.Context(), fake{tool.KindGo, func(context.Context, *tool.Call) (*tool.Result, error) {
			return &tool.Result{Output: out}, nil
		}}, &tool.Call{Tool: "t", MaxOutput: 8}, tb(time.Second, budget.Cooperative), tool.Hooks{})
		if !x.Result.Truncated || len(x.Result.Output) > 8 {
			t.Fatalf("output %q truncated=%v", x.Result.Output, x.Result.Truncated)
		}
		res := tool.ModelResult("t", tb(time.Second, budget.Cooperative), x)
		if !strings.HasPrefix(res, "ab\uFFFDüü") || !strings.Contains(res, "truncated") {
			t.Fatalf("model result %q", res)
		}
	})
}

// TestASchemaThatDoesNotCompileSaysWhy: a schema the library cannot
// resolve is refused saying what is wrong with it, not in the library's
// own words for the schema.
func TestASchemaThatDoesNotCompileSaysWhy(t *testing.T) {
	_, err := tool.CompileSchema(json.RawMessage(`{"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}`))
	if err == nil || !strings.HasPrefix(err.Error(), "input_schema: pattern: error parsing regexp: missing closing )") {
		t.Fatalf("%v", err)
	}
}

func TestSchemaCheck(t *testing.T) {
	s, err := tool.CompileSchema(json.RawMessage(`{"type": "object", "properties": {"n": {"type": "integer", "minimum": 1},
		"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["n"], "additionalProperties": false}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args   string
		reason string
		field  string
	}{
		{`{"n": 2}`, "", ""},
		{`{"n": 2, "tags": ["a"]}`, "", ""},
		{``, "invalid_arguments", "/n"},
		{`{"n": 0}`, "invalid_arguments", "/n"},
		{`{"n": "2"}`, "invalid_arguments", "/n"},
		{`{"n": 2, "extra": 1}`, "invalid_arguments", "/extra"},
		{`{"n": 2`, "invalid_json", ""},
		{`{"n": 2} x`, "invalid_json", ""},
		{`[1]`, "invalid_arguments", ""},
	}
	for _, tc := range cases {
		err := s.Check(json.RawMessage(tc.args))
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.args, err)
			}
			continue
		}
		var ae *tool.ArgumentError
		if !errors.As(err, &ae) || ae.Reason != tc.reason || ae.Field != tc.field {
			t.Errorf("%s: got %#v, want %s %s", tc.args, err, tc.reason, tc.field)
		}
	}
}

func TestTypedInfersTheSchema(t *testing.T) {
	type in struct {
		Text string `json:"text" jsonschema:"the text to count"`
	}
	wc := tool.Typed("word_count", "counts words", func(_ context.Context, v in, _ tool.Progress) (int, error) {
		return len(strings.Fields(v.Text)), nil
	})
	if !strings.Contains(string(wc.Spec().InputSchema), `"text"`) {
		t.Fatalf("schema %s", wc.Spec().InputSchema)
	}
	r, err := wc.Call(t.Context(), &tool.Call{Input: json.RawMessage(`{"text": "a b c"}`)})
	if err != nil || string(r.Output) != "3" {
		t.Fatalf("got %s, %v", r.Output, err)
	}
}

// TestASchemaThatIsNoObjectIsRefused: a tool's arguments are always a
// JSON object, so a schema of another type is refused when it is
// compiled, not met at every call (tool.Typed of a string, say); Typed of
// a pointer to a struct takes an object, not "null or an object".
func TestASchemaThatIsNoObjectIsRefused(t *testing.T) {
	for _, raw := range []string{`{"type": "string"}`, `{"type": ["null", "array"]}`, `{"type": ["object", "null"]}`} {
		_, err := tool.CompileSchema(json.RawMessage(raw))
		if err == nil || !strings.Contains(err.Error(), "but a tool's arguments are always a JSON object (use type: object)") {
			t.Errorf("%s: %v", raw, err)
		}
	}
	type in struct {
		Text string `json:"text"`
	}
	ptr := tool.Typed("p", "d", func(_ context.Context, v *in, _ tool.Progress) (string, error) { return v.Text, nil })
	if _, err := tool.CompileSchema(ptr.Spec().InputSchema); err != nil || !strings.HasPrefix(string(ptr.Spec().InputSchema), `{"type":"object"`) {
		t.Errorf("Typed of a pointer: %s: %v", ptr.Spec().InputSchema, err)
	}
	r, err := ptr.Call(t.Context(), &tool.Call{Input: json.RawMessage(`{"text": "hi"}`)})
	if err != nil || string(r.Output) != "hi" {
		t.Errorf("Typed of a pointer, called: %v %v", r, err)
	}
}

// TestRunLeavesTheCallAlone: Run gives the tool a filled copy of the call
// and says in the Execution what it decided; the caller's Call is its
// input only.
func TestRunLeavesTheCallAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen tool.Call
		f := fake{kind: tool.KindGo, fn: func(ctx context.Context, c *tool.Call) (*tool.Result, error) {
			seen = *c
			return &tool.Result{Output: []byte("ok")}, nil
		}}
		in := &tool.Call{ID: "c1", Tool: "t"}
		start := time.Now()
		x := tool.Run(t.Context(), f, in, tb(time.Minute, budget.Cooperative), tool.Hooks{})
		if in.Progress != nil || !in.Deadline.IsZero() || in.Timeout != 0 || in.KillGrace != 0 {
			t.Errorf("Run filled the caller's call: %+v", in)
		}
		if want := start.Add(time.Minute); !seen.Deadline.Equal(want) || !x.Deadline.Equal(want) || seen.KillGrace != 2*time.Second {
			t.Errorf("the tool saw deadline %v, kill grace %v; the execution says %v; want %v and 2s", seen.Deadline, seen.KillGrace, x.Deadline, want)
		}
	})
}

// TestANilHandlerSaysSo: a Func made with a nil Handler fails each call
// saying so, not with a nil dereference's panic (agent.New refuses it
// first, through Check; a program may still call it through tool.Run).
func TestANilHandlerSaysSo(t *testing.T) {
	x := tool.Run(context.Background(), tool.NewFunc("f", "d", nil, nil), &tool.Call{ID: "c", Tool: "f", Input: json.RawMessage(`{}`)}, tb(time.Second, budget.Cooperative), tool.Hooks{})
	if x.Outcome != event.OutcomeError || x.Err == nil || !strings.Contains(x.Err.Error(), "tool.NewFunc or tool.Typed was given nil") {
		t.Fatalf("%s: %v", x.Outcome, x.Err)
	}
}

// TestTypeMismatchesInJSONsWords: a wrong type is said in JSON's words —
// a null was "<invalid reflect.Value> has type \"null\"" to the model.
func TestTypeMismatchesInJSONsWords(t *testing.T) {
	s, err := tool.CompileSchema(json.RawMessage(`{"type": "object", "properties": {"who": {"type": "string"}, "n": {"type": ["integer", "null"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		`{"who": null}`: `Argument "who" is invalid: it is null, and the tool takes a string.`,
		`{"who": 5}`:    `Argument "who" is invalid: it is an integer, and the tool takes a string.`,
		`{"n": "x"}`:    `Argument "n" is invalid: it is a string, and the tool takes an integer or null.`,
	} {
		var ae *tool.ArgumentError
		if err := s.Check(json.RawMessage(args)); !errors.As(err, &ae) || ae.Message != want {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}

// TestASchemaTypeThatIsNoJSONTypeIsRefused: "type": "strng" is refused when
// the schema is compiled (at load, so validate says it), not at every
// call; a property named "type", and data holding one, are not types.
func TestASchemaTypeThatIsNoJSONTypeIsRefused(t *testing.T) {
	_, err := tool.CompileSchema(json.RawMessage(`{"type": "object", "properties": {"who": {"type": ["strng", "null"]}}}`))
	if err == nil || err.Error() != `input_schema: properties: who: type "strng" is not a JSON type (string, number, integer, boolean, object, array or null)` {
		t.Errorf("%v", err)
	}
	if _, err := tool.CompileSchema(json.RawMessage(`{"type": "object", "properties": {"type": {"type": "string", "default": {"type": "custom"}, "enum": [{"type": "x"}]}}}`)); err != nil {
		t.Errorf("a property named type: %v", err)
	}
}

// TestAStoppedCallSaysHowFarItGot: a call stopped at its deadline tells
// the model its last progress report, which is all an MCP call's result
// can say of how far it got.
func TestAStoppedCallSaysHowFarItGot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tl := tool.NewFunc("fetch", "fetches", nil, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
			two, ten := 2.0, 10.0
			p.Report(tool.Report{Progress: &two, Total: &ten, Message: "fetching page 2"})
			<-ctx.Done()
			return nil, ctx.Err()
		})
		b := budget.ToolBudget{Timeout: budget.Duration{D: time.Second, Source: budget.SourceTool, Knob: "tools[fetch].timeout"}, Enforcement: budget.Hard}
		x := tool.Run(t.Context(), tl, &tool.Call{ID: "c1", Tool: "fetch"}, b, tool.Hooks{})
		if x.Outcome != event.OutcomeTimedOut {
			t.Fatalf("outcome %s", x.Outcome)
		}
		if res := tool.ModelResult("fetch", b, x); !strings.Contains(res, `"last_progress":"2 of 10: fetching page 2"`) {
			t.Errorf("result %s", res)
		}
	})
}

// TestDeniedSaysWhoDecided: a call timebox denied because no person could
// be asked is not said to be a person's decision.
func TestDeniedSaysWhoDecided(t *testing.T) {
	if got := tool.Denied("deploy", "alice", "not now"); !strings.Contains(got, `A person denied this call (alice): not now.`) {
		t.Errorf("%s", got)
	}
	got := tool.Denied("deploy", "timebox run", "nobody could be asked (no terminal, or --json)")
	if !strings.Contains(got, `This call was denied without a person's decision (timebox run): nobody could be asked`) || strings.Contains(got, "A person") {
		t.Errorf("%s", got)
	}
}

// TestStoppedByWords: a call stopped because its turn's client went
// away, or the server shuts down, says so in words ("client_gone by the
// client" before), with the comma a heartbeat clause wants.
func TestStoppedByWords(t *testing.T) {
	for cause, want := range map[error]string{
		&budget.CancelError{Reason: budget.ClientGone, By: "the client"}:                                                                        "because the turn was stopped (its client went away).",
		&budget.CancelError{Reason: budget.ClientGone, By: "the timebox process following it (pid 7), which stopped sending heartbeats 3s ago"}: "which stopped sending heartbeats 3s ago, went away).",
		&budget.CancelError{Reason: budget.Shutdown, By: "the server"}:                                                                          "because the turn was stopped (the server is shutting down).",
	} {
		x := &tool.Execution{Outcome: event.OutcomeCancelled, Phase: budget.PhaseCancel, Cause: cause}
		if got := tool.ModelResult("t", budget.ToolBudget{Timeout: budget.Duration{D: time.Second}}, x); !strings.Contains(got, want) {
			t.Errorf("%v: %s", cause, got)
		}
	}
}
