package temporal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// The tests of this file run a turn's workflow in Temporal's test
// environment (go.temporal.io/sdk/testsuite), with the real activities, a
// real agent and an in-memory store: the workflow's decisions under the
// ceiling, the step watchdog, a cancel signal, a lost or retried call, a
// lost model step, a history past continue-as-new — without a dev server.

// suite is one turn's workflow in a test environment.
type suite struct {
	testsuite.WorkflowTestSuite
	env   *testsuite.TestWorkflowEnvironment
	store *store.Memory
	units machine.Units
	x     *activities
	// suggest: Temporal suggests continue-as-new to every run.
	suggest bool
	// logger, when set, is the SDK's logger (quietLogger otherwise).
	logger interface {
		Debug(string, ...any)
		Info(string, ...any)
		Warn(string, ...any)
		Error(string, ...any)
	}
}

func newSuite(t *testing.T, a *agent.Agent) *suite {
	t.Helper()
	s := &suite{store: store.NewMemory()}
	t.Cleanup(func() { s.store.Close() })
	units, ok := machine.UnitsOf(a)
	if !ok {
		t.Fatal("no units for the agent")
	}
	s.units = units
	s.x = &activities{units: units, store: s.store, payloads: s.store, heartbeat: time.Second, log: slog.New(slog.DiscardHandler), under: &counted{}, spans: &counted{}}
	s.env = s.newEnv()
	return s
}

func (s *suite) newEnv() *testsuite.TestWorkflowEnvironment {
	s.SetLogger(quietLogger{})
	if s.logger != nil {
		s.SetLogger(s.logger)
	}
	env := s.NewTestWorkflowEnvironment()
	register(env, s.units, s.store, s.store, time.Second, s.x.log, s.x.under, s.x.spans, context.Background())
	env.SetContinueAsNewSuggested(s.suggest)
	return env
}

// start begins turn id as a Runner does, and returns its first state.
func (s *suite) start(t *testing.T, id, text string, history ...model.Message) machine.State {
	t.Helper()
	st, repaired := s.units.NewState(id, "", history, nil)
	if err := s.store.BeginTurn(context.Background(), store.TurnStart{TurnID: id, Engine: Engine, Input: text, StartedAt: st.Start}); err != nil {
		t.Fatal(err)
	}
	if err := putInput(context.Background(), s.store, id, text, repaired); err != nil {
		t.Fatal(err)
	}
	return *st
}

// run runs the workflow of a turn begun by start to its end — across its
// runs when it continues as new — and returns its stored record and the
// number of runs.
func (s *suite) run(t *testing.T, st machine.State) (*event.Turn, int) {
	t.Helper()
	env, runs := s.env, 1
	for {
		env.ExecuteWorkflow(WorkflowName, st)
		if !env.IsWorkflowCompleted() {
			t.Fatal("the workflow did not complete")
		}
		var can *workflow.ContinueAsNewError
		if err := env.GetWorkflowError(); errors.As(err, &can) {
			if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &st); err != nil {
				t.Fatal(err)
			}
			env, runs = s.newEnv(), runs+1
			continue
		} else if err != nil {
			t.Fatalf("workflow: %v", err)
		}
		var out Outcome
		if err := env.GetWorkflowResult(&out); err != nil {
			t.Fatal(err)
		}
		rec, err := s.store.Turn(context.Background(), st.TurnID)
		if err != nil {
			t.Fatal(err)
		}
		if out.Status != rec.Status || out.StopReason != rec.StopReason {
			t.Errorf("the workflow says %s/%s, the store %s/%s", out.Status, out.StopReason, rec.Status, rec.StopReason)
		}
		if rec.Events, err = s.store.Events(context.Background(), st.TurnID, 0, 0); err != nil {
			t.Fatal(err)
		}
		return rec, runs
	}
}

type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

// newAgent builds an agent on a script model playing lines, with budgets
// b (kill grace 100ms unless set) and tools.
func newAgent(t *testing.T, lines string, b budget.Budgets, l budget.Limits, tools ...agent.Tool) *agent.Agent {
	t.Helper()
	ls, err := script.Parse(strings.NewReader(lines), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(ls)
	if err != nil {
		t.Fatal(err)
	}
	if b.KillGrace.Unset() {
		b.KillGrace = budget.Duration{D: 100 * time.Millisecond, Source: budget.SourceCode}
	}
	a, err := agent.New(agent.Config{Name: "suite", Origin: "suite.yaml", Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
		Tools: tools, Budgets: b, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func goTool(name string, timeout time.Duration, fn tool.Handler) agent.Tool {
	return agent.Tool{Tool: tool.NewFunc(name, name+" (a test tool)", nil, fn),
		Budget: budget.ToolBudget{Timeout: budget.Duration{D: timeout, Source: budget.SourceTool}, Enforcement: budget.Cooperative}}
}

func echoTool() agent.Tool {
	return goTool("echo", 5*time.Second, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
		return "echo " + string(in), nil
	})
}

// waitTool waits for its context: the turn's ceiling, a cancellation.
func waitTool(timeout time.Duration) agent.Tool {
	return goTool("wait", timeout, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
}

// digits hides the figures of a message, durations whole ("after 2.1s",
// "after 900ms": the two engines' turns need not take the same time).
var digits = regexp.MustCompile(`([0-9]+(\.[0-9]+)?(ns|µs|ms|s|m|h))+|[0-9]+(\.[0-9]+)?`)

func dur(d time.Duration) budget.Duration { return budget.Duration{D: d, Source: budget.SourceCode} }

// finished returns the turn's turn_finished.
func finished(t *testing.T, rec *event.Turn) *event.TurnFinished {
	t.Helper()
	if n := len(rec.Events); n == 0 || rec.Events[n-1].Type != event.TypeTurnFinished {
		t.Fatalf("the turn's last event is not turn_finished: %d events", n)
	}
	return rec.Events[len(rec.Events)-1].Data.(*event.TurnFinished)
}

// count returns how many events of type typ the turn has.
func count(rec *event.Turn, typ event.Type) int {
	n := 0
	for _, e := range rec.Events {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func TestSuiteTurn(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, echoTool())
	s := newSuite(t, a)
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.Status != budget.StatusCompleted || rec.Answer != "done" {
		t.Fatalf("turn ended %s/%s: %s", rec.Status, rec.StopReason, rec.Message)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeOK {
		t.Fatalf("tool calls: %+v", rec.ToolCalls)
	}
}

// TestSuiteIsRun runs turns on the embedded engine and through the
// workflow, and compares their records, messages and events: the same
// machine decides both — parallel calls, an unknown tool, arguments that
// fail the schema, max_tool_calls, max_steps.
func TestSuiteIsRun(t *testing.T) {
	const script = `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}, {"name": "echo", "arguments": {"x": 2}}, {"name": "nope"}]}
{"tool_calls": [{"name": "echo", "arguments": "not json"}]}
{"text": "done"}
`
	for _, tc := range []struct {
		name   string
		limits budget.Limits
	}{
		{name: "answer"},
		{name: "max_tool_calls", limits: budget.Limits{MaxToolCalls: budget.Count{N: 2, Source: budget.SourceCode}}},
		{name: "max_steps", limits: budget.Limits{MaxSteps: budget.Count{N: 1, Source: budget.SourceCode}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := newAgent(t, script, budget.Budgets{}, tc.limits, echoTool()).Run(context.Background(),
				agent.Input{TurnID: "t1", Text: "go", History: []model.Message{{Role: model.RoleUser, Content: "before"}, {Role: model.RoleAssistant, Content: "ok"}}})
			s := newSuite(t, newAgent(t, script, budget.Budgets{}, tc.limits, echoTool()))
			got, _ := s.run(t, s.start(t, "t1", "go", model.Message{Role: model.RoleUser, Content: "before"}, model.Message{Role: model.RoleAssistant, Content: "ok"}))
			opts := cmp.Options{
				cmpopts.IgnoreFields(event.Turn{}, "StartedAt", "EndedAt", "WallMS", "LLMMS", "ToolMS", "Events"),
				cmpopts.IgnoreFields(event.ToolCall{}, "StartedAt", "EndedAt", "DurationMS"),
				cmpopts.IgnoreFields(event.ModelCall{}, "StartedAt", "FirstChunkMS", "StreamMS"),
				cmpopts.SortSlices(func(a, b event.ToolCall) bool { return a.CallID < b.CallID }),
				cmp.Transformer("compact", func(r json.RawMessage) string {
					var b bytes.Buffer
					if json.Compact(&b, r) != nil {
						return string(r)
					}
					return b.String()
				}),
				cmp.Transformer("digits", func(s string) string { return digits.ReplaceAllString(s, "N") }),
			}
			if diff := cmp.Diff(want.Record, got, opts); diff != "" {
				t.Errorf("record (-Run +workflow):\n%s", diff)
			}
			var types, wantTypes []event.Type
			for _, e := range got.Events {
				types = append(types, e.Type)
			}
			for _, e := range want.Record.Events {
				wantTypes = append(wantTypes, e.Type)
			}
			// The calls of a batch run at once on both engines: their
			// events interleave as they happen.
			sorted := cmpopts.SortSlices(func(a, b event.Type) bool { return a < b })
			if diff := cmp.Diff(wantTypes, types, sorted); diff != "" {
				t.Errorf("events (-Run +workflow):\n%s", diff)
			}
			var msgs []model.Message
			if err := s.store.PayloadRange(context.Background(), "t1", keyMessage, func(_ string, data []byte) error {
				var m model.Message
				json.Unmarshal(data, &m)
				msgs = append(msgs, m)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.Messages, msgs); diff != "" {
				t.Errorf("messages (-Run +workflow):\n%s", diff)
			}
		})
	}
}

// TestSuiteCeiling: the turn's ceiling stops a call waiting on its
// context, and the turn ends as on the embedded engine.
//
// The call's unit stops at the ceiling by itself and reports; so does the
// workflow's timer, which cancels the turn's work. A server waits for a
// cancelled activity to report (WaitForCancellation), but the test
// environment resolves its future as cancelled at once, and the call was
// recorded as lost when the timer won the race: 1 run in 80 under -race,
// and in CI at a ceiling of 1s and of 3s, in a bare `go test -race ./...`
// at 6s (none in 160 runs since). So the workflow's clock
// starts a little before the turn, and its ceiling falls that much after
// the unit's. The environment's own timeout (3s unless set) is longer
// than the ceiling: while an activity runs, its clock is real time.
func TestSuiteCeiling(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "wait"}]}`+"\n", budget.Budgets{Turn: dur(3 * time.Second)}, budget.Limits{}, waitTool(time.Minute))
	s := newSuite(t, a)
	s.env.SetTestTimeout(30 * time.Second)
	s.env.SetStartTime(time.Now().Add(-250 * time.Millisecond))
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	fin := finished(t, rec)
	if rec.StopReason != budget.TurnTimeout || !fin.Flags.TimedOutByTurnBudget || !fin.Flags.TimedOutDuringToolExecution {
		for _, e := range rec.Events {
			t.Logf("%d %s %s %+v", e.Seq, e.At.Format("15:04:05.000"), e.Type, e.Data)
		}
		t.Fatalf("turn ended %s with flags %+v: %s", rec.StopReason, fin.Flags, rec.Message)
	}
	if !strings.Contains(rec.Message, "Last step: tool wait, running for") {
		t.Errorf("message: %s", rec.Message)
	}
	if c := rec.ToolCalls; len(c) != 1 || c[0].Outcome != event.OutcomeCancelled || c[0].Phase != budget.PhaseTurn {
		t.Errorf("the call's record: %+v", c)
	}
}

// TestSuiteStep: a model that stays silent past the step watchdog stops
// the turn no_progress, in the unit that was waiting for it.
func TestSuiteStep(t *testing.T) {
	a := newAgent(t, `{"text": "late", "first_chunk_delay": "5s"}`+"\n",
		budget.Budgets{Step: dur(300 * time.Millisecond), LLMFirstChunk: dur(time.Minute)}, budget.Limits{})
	s := newSuite(t, a)
	start := time.Now()
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.StopReason != budget.NoProgress || !strings.Contains(rec.Message, "nothing progressed for 300ms") {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("it took %v to stop", d)
	}
}

// TestSuiteCancelSignal: a cancel signal stops the running call and ends
// the turn cancelled, saying who cancelled.
func TestSuiteCancelSignal(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "wait"}]}`+"\n", budget.Budgets{}, budget.Limits{}, waitTool(time.Minute))
	s := newSuite(t, a)
	s.env.RegisterDelayedCallback(func() {
		// As a Runner cancels: a signal, and a request in the store.
		s.env.SignalWorkflow(SignalCancel, &budget.CancelError{Reason: budget.Cancelled, By: "the test"})
		if err := s.store.RequestCancel(context.Background(), "t1"); err != nil {
			t.Error(err)
		}
	}, 300*time.Millisecond)
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.StopReason != budget.Cancelled || !strings.HasPrefix(rec.Message, "Cancelled by the test after") ||
		!strings.Contains(rec.Message, "tool wait was stopped") {
		for _, e := range rec.Events {
			t.Logf("%d %s %+v", e.Seq, e.Type, e.Data)
		}
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	if c := rec.ToolCalls; len(c) != 1 || c[0].Outcome != event.OutcomeCancelled {
		t.Errorf("the call's record: %+v", c)
	}
}

// lostCall makes the Call activity of the named tool fail as a worker that
// died after heartbeating would (a heartbeat timeout with the last beat),
// and run the real one for every other call. attempts counts the calls
// of the tool.
func (s *suite) lostCall(name string, times int, attempts *int) {
	s.env.OnActivity(actCall, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*machine.Called, error) {
		if in.Call.Name != name {
			return s.x.Call(ctx, in)
		}
		*attempts++
		if *attempts > times {
			return s.x.Call(ctx, in)
		}
		// It started, and its last heartbeat said it had run 1.1s and
		// reported progress 3 times (in all its attempts so far: 3 more
		// each). The beat is read from JSON, as Temporal passes it.
		var b beat
		attempt := activity.GetInfo(ctx).Attempt
		if err := json.Unmarshal(fmt.Appendf(nil, `{"call_id": %q, "started": %q, "ran_ms": 1100, "reports": %d, "attempt": %d}`,
			machine.CallID(in.Step, in.Call.Index), time.Now().Add(-5*time.Second).Format(time.RFC3339Nano), 3*attempt, attempt), &b); err != nil {
			return nil, err
		}
		activity.RecordHeartbeat(ctx, b)
		return nil, sdktemporal.NewHeartbeatTimeoutError(b)
	})
}

// warnings is an SDK logger that keeps its warnings.
type warnings struct {
	quietLogger
	mu    sync.Mutex
	warns []string
}

func (w *warnings) Warn(msg string, kv ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warns = append(w.warns, fmt.Sprint(append([]any{msg}, kv...)...))
}

// TestSuiteNoUnhandledSignals: the signals a turn's workflow does not
// read — a second cancel (the runner's and a worker's relay of the
// store's request), a decision's wake-up for a call that waits for none —
// are taken as it ends: the worker logs no "unhandled signals".
func TestSuiteNoUnhandledSignals(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "wait"}]}`+"\n", budget.Budgets{}, budget.Limits{}, waitTool(5*time.Second))
	s := newSuite(t, a)
	w := &warnings{}
	s.logger = w
	s.env = s.newEnv()
	for i, d := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} {
		s.env.RegisterDelayedCallback(func() {
			s.env.SignalWorkflow(SignalCancel, &budget.CancelError{Reason: budget.Cancelled, By: fmt.Sprintf("canceller %d", i+1)})
			s.env.SignalWorkflow(SignalApproval+":call_1_1", nil)
		}, d)
	}
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.StopReason != budget.Cancelled || !strings.Contains(rec.Message, "canceller 1") {
		t.Errorf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	for _, m := range w.warns {
		if strings.Contains(m, "unhandled signals") {
			t.Errorf("the SDK warned: %s", m)
		}
	}
}

// TestSuiteLostCall: a call whose worker is lost gets one record —
// outcome interrupted, phase worker_lost, the time its last heartbeat says
// it ran and when the loss was noticed, apart — the model is told it was
// lost, and the turn goes on.
func TestSuiteLostCall(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, echoTool())
	s := newSuite(t, a)
	var attempts int
	s.lostCall("echo", 1, &attempts)
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	if attempts != 1 {
		t.Errorf("the call was run %d times, want once (no retries declared)", attempts)
	}
	if n := count(rec, event.TypeToolFinished); n != 1 || len(rec.ToolCalls) != 1 {
		t.Fatalf("%d tool_finished, %d records; want one of each", n, len(rec.ToolCalls))
	}
	c := rec.ToolCalls[0]
	if c.Outcome != event.OutcomeInterrupted || c.Phase != budget.PhaseWorkerLost || c.DurationMS != 1100 || c.NoticedAt.IsZero() ||
		!c.NoticedAt.After(c.EndedAt) || !strings.Contains(c.Result, "worker_lost") || !strings.Contains(c.Result, "at least 1.1s") ||
		!strings.Contains(c.Result, "not run again") {
		t.Errorf("the lost call's record: %+v", c)
	}
	// The progress it reported before the loss is counted.
	if c.ProgressCount != 3 || !strings.Contains(c.Result, "reported progress 3 times") {
		t.Errorf("the lost call's progress_count %d, result %s; want 3, said", c.ProgressCount, c.Result)
	}
}

// TestSuiteBeatCountsReports: a call's heartbeat counts every progress
// report it made, coalesced into tool_progress events or not, so that a
// call lost with its worker keeps its progress_count.
func TestSuiteBeatCountsReports(t *testing.T) {
	const reports = 50 // far more than one tool_progress every 100ms
	counted := make(chan struct{})
	progress := goTool("progress", 5*time.Second, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		for i := range reports {
			v := float64(i)
			p.Report(tool.Report{Progress: &v})
		}
		select {
		case <-counted:
			return "counted", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	a := newAgent(t, `{"tool_calls": [{"name": "progress"}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, progress)
	s := newSuite(t, a)
	var once sync.Once
	s.env.SetOnActivityHeartbeatListener(func(_ *activity.Info, d converter.EncodedValues) {
		var b struct {
			Reports int `json:"reports"`
		}
		if d.Get(&b) == nil && b.Reports == reports {
			once.Do(func() { close(counted) })
		}
	})
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if len(rec.ToolCalls) != 1 || !strings.Contains(rec.ToolCalls[0].Result, "counted") {
		t.Fatalf("no heartbeat counted the %d reports: %+v", reports, rec.ToolCalls)
	}
}

// TestSuiteOneNoticeABeat: the silent calls of a batch are named in one
// still_working a beat, as on the embedded engine — not one a call.
func TestSuiteOneNoticeABeat(t *testing.T) {
	var st *store.Memory
	both := func() bool { // a notice named both calls
		evs, _ := st.Events(context.Background(), "t1", 0, 0)
		for _, e := range evs {
			if d, ok := e.Data.(*event.StillWorking); ok && len(d.Calls) == 2 {
				return true
			}
		}
		return false
	}
	silent := goTool("silent", 10*time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		if !wait.Until(2*time.Second, both) {
			return nil, errors.New("no still_working named both calls")
		}
		return "named", nil
	})
	a := newAgent(t, `{"tool_calls": [{"name": "silent"}, {"name": "silent"}]}
{"text": "done"}
`, budget.Budgets{ProgressNotice: dur(300 * time.Millisecond)}, budget.Limits{}, silent)
	s := newSuite(t, a)
	st = s.store
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	for _, c := range rec.ToolCalls {
		if c.Outcome != event.OutcomeOK {
			t.Errorf("call %s: %s %s", c.CallID, c.Outcome, c.Result)
		}
	}
	for _, e := range rec.Events {
		if d, ok := e.Data.(*event.StillWorking); ok && len(d.Calls) != 2 {
			t.Errorf("a still_working named %d calls, want both: %+v", len(d.Calls), d)
		}
	}
}

// TestSuiteRetriedCallLost: a tool that declares retries, whose every run
// is lost with its worker, gets one record that says it was run again —
// how many times, since when — with the progress of every run.
func TestSuiteRetriedCallLost(t *testing.T) {
	echo := echoTool()
	echo.Retries = 1
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, echo)
	s := newSuite(t, a)
	var attempts int
	s.lostCall("echo", 2, &attempts)
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if attempts != 2 || len(rec.ToolCalls) != 1 {
		t.Fatalf("the call was run %d times, with %d records; want twice, one", attempts, len(rec.ToolCalls))
	}
	c := rec.ToolCalls[0]
	b, _ := json.Marshal(c)
	var got struct {
		Runs           int       `json:"runs"`
		FirstStartedAt time.Time `json:"first_started_at"`
		ProgressCount  int       `json:"progress_count"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if c.Outcome != event.OutcomeInterrupted || c.Phase != budget.PhaseWorkerLost || strings.Contains(c.Result, "It was not run again") ||
		!strings.Contains(c.Result, "run 2 times") || got.Runs != 2 || got.FirstStartedAt.IsZero() || got.ProgressCount != 6 {
		t.Errorf("the lost call's record: %s", b)
	}
}

// TestSuiteRetriedCall: a tool that declares retries has its lost call run
// again; the call has one record, the second attempt's.
func TestSuiteRetriedCall(t *testing.T) {
	echo := echoTool()
	echo.Retries = 1
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, echo)
	s := newSuite(t, a)
	var attempts int
	s.lostCall("echo", 1, &attempts)
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if attempts != 2 {
		t.Errorf("the call was run %d times, want twice", attempts)
	}
	if n := count(rec, event.TypeToolFinished); n != 1 || len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeOK {
		t.Fatalf("%d tool_finished, records %+v; want one, ok", n, rec.ToolCalls)
	}
	// Its record says it ran twice, since when, and the progress the lost
	// run reported.
	b, _ := json.Marshal(rec.ToolCalls[0])
	var got struct {
		Runs           int       `json:"runs"`
		FirstStartedAt time.Time `json:"first_started_at"`
		StartedAt      time.Time `json:"started_at"`
		ProgressCount  int       `json:"progress_count"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Runs != 2 || got.FirstStartedAt.IsZero() || !got.FirstStartedAt.Before(got.StartedAt) || got.ProgressCount != 3 {
		t.Errorf("the retried call's record: %s", b)
	}
}

// TestSuiteReportLost: a call that ended but whose report to Temporal was
// lost is not taken for lost: its result, kept in the store, is used.
func TestSuiteReportLost(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, budget.Budgets{}, budget.Limits{}, echoTool())
	s := newSuite(t, a)
	s.env.OnActivity(actCall, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*machine.Called, error) {
		if _, err := s.x.Call(ctx, in); err != nil {
			return nil, err
		}
		return nil, sdktemporal.NewHeartbeatTimeoutError()
	})
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if n := count(rec, event.TypeToolFinished); n != 1 || len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeOK {
		t.Fatalf("%d tool_finished, records %+v; want one, ok", n, rec.ToolCalls)
	}
	if rec.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
}

// TestSuiteLostModelStep: a model step whose worker died mid-attempt gets
// a record for the lost attempt (interrupted, worker_lost), is asked
// again, and numbers its attempts once.
func TestSuiteLostModelStep(t *testing.T) {
	a := newAgent(t, `{"text": "done"}`+"\n", budget.Budgets{}, budget.Limits{})
	s := newSuite(t, a)
	lost := 0
	s.env.OnActivity(actAdvance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*advanced, error) {
		if lost == 0 {
			lost++
			// The worker began the step — turn_started, the attempt's
			// llm_started — and died.
			for _, p := range []event.Payload{&event.TurnStarted{Agent: "suite"}, &event.LLMStarted{Step: 1, Model: "m", Provider: "script", Attempt: 1}} {
				if err := s.store.AppendEvent(ctx, event.Event{TurnID: in.State.TurnID, Type: p.Type(), At: time.Now(), Data: p}); err != nil {
					return nil, err
				}
			}
			return nil, sdktemporal.NewHeartbeatTimeoutError()
		}
		return s.x.Advance(ctx, in)
	})
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	if n := count(rec, event.TypeTurnStarted); n != 1 {
		t.Errorf("%d turn_started", n)
	}
	var attempts []int
	for _, e := range rec.Events {
		if d, ok := e.Data.(*event.LLMStarted); ok {
			attempts = append(attempts, d.Attempt)
		}
	}
	if !cmp.Equal(attempts, []int{1, 2}) {
		t.Errorf("llm_started attempts %v, want [1 2]", attempts)
	}
	mc := rec.ModelCalls
	if len(mc) != 2 || mc[0].Attempt != 1 || mc[0].Outcome != event.OutcomeInterrupted || mc[0].Phase != budget.PhaseWorkerLost ||
		mc[1].Attempt != 2 || mc[1].Outcome != event.OutcomeOK {
		t.Errorf("model call records: %+v", mc)
	}
}

// TestSuiteLostCompaction: a compaction whose worker died mid-call gets a
// record, as a lost model attempt does (compaction_finished, outcome
// interrupted, phase worker_lost), and the compaction asked again numbers
// its attempt on from it.
func TestSuiteLostCompaction(t *testing.T) {
	ls, err := script.Parse(strings.NewReader(`{"text": "They asked four questions."}`+"\n"+`{"text": "done"}`+"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(ls)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Name: "suite", Origin: "suite.yaml", Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
		CompactAt: 500})
	if err != nil {
		t.Fatal(err)
	}
	var history []model.Message
	for i := range 4 {
		history = append(history, model.Message{Role: model.RoleUser, Content: strings.Repeat("question ", 100) + string(rune('a'+i))},
			model.Message{Role: model.RoleAssistant, Content: strings.Repeat("answer ", 150)})
	}
	s := newSuite(t, a)
	lost := 0
	s.env.OnActivity(actAdvance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*advanced, error) {
		if lost == 0 {
			lost++
			// The worker began the turn and its compaction, and died.
			for _, p := range []event.Payload{&event.TurnStarted{Agent: "suite"},
				&event.CompactionStarted{Step: 1, Attempt: 1, EstimatedTokens: 1300, CompactAt: 500, LimitMS: 60000}} {
				if err := s.store.AppendEvent(ctx, event.Event{TurnID: in.State.TurnID, Type: p.Type(), At: time.Now(), Data: p}); err != nil {
					return nil, err
				}
			}
			return nil, sdktemporal.NewHeartbeatTimeoutError()
		}
		return s.x.Advance(ctx, in)
	})
	rec, _ := s.run(t, s.start(t, "t1", "and now?", history...))
	if rec.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	var fins []event.CompactionFinished
	var started []int
	for _, e := range rec.Events {
		switch d := e.Data.(type) {
		case *event.CompactionStarted:
			started = append(started, d.Attempt)
		case *event.CompactionFinished:
			fins = append(fins, *d)
		}
	}
	if !cmp.Equal(started, []int{1, 2}) {
		t.Errorf("compaction_started attempts %v, want [1 2]", started)
	}
	if len(fins) != 2 || fins[0].Outcome != event.OutcomeInterrupted || fins[0].Phase != budget.PhaseWorkerLost || fins[0].Record == nil ||
		fins[0].Record.Attempt != 1 || !strings.Contains(fins[0].Message, "lost") || fins[1].Outcome != event.OutcomeOK || fins[1].Record.Attempt != 2 {
		t.Fatalf("compaction_finished: %+v", fins)
	}
	var comps []event.ModelCall
	for _, mc := range rec.ModelCalls {
		if mc.Compaction {
			comps = append(comps, mc)
		}
	}
	if len(comps) != 2 || comps[0].Attempt != 1 || comps[0].Outcome != event.OutcomeInterrupted || comps[0].Phase != budget.PhaseWorkerLost ||
		comps[0].Model != "m" || comps[1].Attempt != 2 || comps[1].Outcome != event.OutcomeOK {
		t.Errorf("compaction records: %+v", comps)
	}
}

// TestSuiteLostModelStepTime: the record of a model attempt lost with its
// worker says how long it is known to have run — to its last stream chunk
// stored — not until another worker noticed the loss: that wait is no
// model's slowness, and the timeline would draw it as one.
func TestSuiteLostModelStepTime(t *testing.T) {
	a := newAgent(t, `{"text": "done"}`+"\n", budget.Budgets{}, budget.Limits{})
	s := newSuite(t, a)
	lost := 0
	began := time.Now().Add(-3 * time.Second)
	s.env.OnActivity(actAdvance, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*advanced, error) {
		if lost == 0 {
			lost++
			// The attempt began 3s ago, streamed a chunk 1s in, and its
			// worker died.
			for i, p := range []event.Payload{&event.TurnStarted{Agent: "suite"}, &event.LLMStarted{Step: 1, Model: "m", Provider: "script", Attempt: 1},
				&event.LLMDelta{Step: 1, Text: "Wor"}} {
				at := began.Add(time.Duration(max(i-1, 0)) * time.Second)
				if err := s.store.AppendEvent(ctx, event.Event{TurnID: in.State.TurnID, Type: p.Type(), At: at, Data: p}); err != nil {
					return nil, err
				}
			}
			return nil, sdktemporal.NewHeartbeatTimeoutError()
		}
		return s.x.Advance(ctx, in)
	})
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if rec.Status != budget.StatusCompleted || len(rec.ModelCalls) != 2 {
		t.Fatalf("turn ended %s: %s; calls %+v", rec.StopReason, rec.Message, rec.ModelCalls)
	}
	if mc := rec.ModelCalls[0]; mc.Phase != budget.PhaseWorkerLost || mc.StreamMS != 1000 || !strings.Contains(mc.Error, "last heard from 1s after it began") {
		t.Errorf("the lost attempt's record: %dms, %q; want 1000ms, to its last chunk", mc.StreamMS, mc.Error)
	}
}

// TestSuiteAgentMismatch: a turn started for another agent is refused by
// the worker: failed, agent_mismatch, naming both, nothing run.
func TestSuiteAgentMismatch(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo"}]}`+"\n", budget.Budgets{}, budget.Limits{}, echoTool())
	s := newSuite(t, a)
	st := s.start(t, "t1", "go")
	st.Agent = &machine.AgentRef{Name: "other", Origin: "b.yaml", Fingerprint: "0123456789abcdef"}
	rec, _ := s.run(t, st)
	if rec.Status != budget.StatusFailed || rec.StopReason != budget.AgentMismatch ||
		!strings.Contains(rec.Message, `b.yaml ("other")`) || !strings.Contains(rec.Message, `suite.yaml ("suite")`) {
		t.Fatalf("turn ended %s/%s: %s", rec.Status, rec.StopReason, rec.Message)
	}
	if len(rec.ModelCalls) != 0 || len(rec.ToolCalls) != 0 {
		t.Errorf("something ran: %d model calls, %d tool calls", len(rec.ModelCalls), len(rec.ToolCalls))
	}
}

// TestSuiteContextMismatch: a turn started with the worker's agent file
// but other context settings (a gateway's --compact-at) is refused saying
// so, not that the agent's instructions, models or tools differ.
func TestSuiteContextMismatch(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo"}]}`+"\n", budget.Budgets{}, budget.Limits{}, echoTool())
	s := newSuite(t, a)
	st := s.start(t, "t1", "go")
	ref := *st.Agent
	ref.Fingerprint, ref.Context = "0123456789abcdef", "context.compact_at 0, context.time_notes on"
	st.Agent = &ref
	rec, _ := s.run(t, st)
	if rec.StopReason != budget.AgentMismatch || !strings.Contains(rec.Message, "with context.compact_at 0, context.time_notes on, but the worker") ||
		!strings.Contains(rec.Message, "--compact-at or --time-notes") {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
}

// TestSuiteContinueAsNew: a turn whose history Temporal finds long goes
// on in new runs, and ends as it would have in one.
func TestSuiteContinueAsNew(t *testing.T) {
	a := newAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}`+"\n",
		budget.Budgets{}, budget.Limits{MaxSteps: budget.Count{N: 40, Source: budget.SourceCode}, MaxToolCalls: budget.Count{N: 100, Source: budget.SourceCode}}, echoTool())
	s := newSuite(t, a)
	s.suggest = true
	s.env = s.newEnv()
	rec, runs := s.run(t, s.start(t, "t1", "go"))
	if rec.StopReason != budget.MaxSteps || rec.Steps != 40 || len(rec.ToolCalls) != 40 {
		t.Fatalf("turn ended %s after %d steps, %d calls: %s", rec.StopReason, rec.Steps, len(rec.ToolCalls), rec.Message)
	}
	if runs < 3 {
		t.Errorf("the turn ran in %d runs, want several", runs)
	}
	for i, e := range rec.Events {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
}

// TestSuiteRunnerBudgets: a turn runs with the budgets its runner
// resolved — flags, environment, request — whatever the worker's own: a
// tool without a timeout of its own takes the turn's, sourced as the
// runner's.
func TestSuiteRunnerBudgets(t *testing.T) {
	const script = `{"tool_calls": [{"name": "wait"}]}
{"text": "done"}
`
	wait := agent.Tool{Tool: tool.NewFunc("wait", "waits", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})}
	worker := newAgent(t, script, budget.Budgets{}, budget.Limits{}, wait)
	runner := newAgent(t, script, budget.Budgets{
		Tool: budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceFlag, Knob: "--tool-timeout"},
		Turn: budget.Duration{D: 20 * time.Second, Source: budget.SourceFlag, Knob: "--turn-timeout"},
	}, budget.Limits{}, wait)
	s := newSuite(t, worker)
	units, _ := machine.UnitsOf(runner)
	st, history := units.NewState("t1", "", nil, nil)
	if err := s.store.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Engine: Engine, Input: "go", StartedAt: st.Start}); err != nil {
		t.Fatal(err)
	}
	if err := putInput(context.Background(), s.store, "t1", "go", history); err != nil {
		t.Fatal(err)
	}
	rec, _ := s.run(t, *st)
	if rec.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", rec.StopReason, rec.Message)
	}
	c := rec.ToolCalls[0]
	if c.Outcome != event.OutcomeTimedOut || c.TimeoutMS != 300 || c.TimeoutSource != budget.SourceFlag {
		t.Errorf("the call: %s after %dms, timeout %dms from %s; want timed_out at the runner's 300ms (flag)", c.Outcome, c.DurationMS, c.TimeoutMS, c.TimeoutSource)
	}
	started := rec.Events[0].Data.(*event.TurnStarted)
	if b := started.Budgets["timeouts.turn"]; b.Source != budget.SourceFlag || b.MS != 20000 {
		t.Errorf("turn_started says the turn's budget is %+v; want 20s from the flag", b)
	}
	if tb := started.Tools["wait"]; tb.TimeoutMS != 300 || tb.Source != budget.SourceFlag {
		t.Errorf("turn_started says the tool's budget is %+v", tb)
	}
}

// TestSuiteAskRetried: an Ask whose report to Temporal was lost once the
// request was stored (its worker killed as the person was being asked) is
// run again, and the person is not asked twice: one approval_requested,
// the stored request the call's wait. The fault suite's "worker kill -9
// while a call waits for a person" saw the person asked twice.
func TestSuiteAskRetried(t *testing.T) {
	dep := goTool("deploy", time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "deployed", nil })
	dep.NeedsApproval = func(json.RawMessage) bool { return true }
	a := newAgent(t, `{"tool_calls": [{"name": "deploy"}]}`+"\n"+`{"text": "done"}`+"\n",
		budget.Budgets{Approval: budget.Duration{D: 5 * time.Second, Source: budget.SourceCode}}, budget.Limits{}, dep)
	s := newSuite(t, a)
	lost := false
	s.env.OnActivity(actAsk, mock.Anything, mock.Anything).Return(func(ctx context.Context, in *unitIn) (*asked, error) {
		out, err := s.x.Ask(ctx, in)
		if err == nil && !lost {
			lost = true
			return nil, errors.New("the worker died before it reported")
		}
		return out, err
	})
	rec, _ := s.run(t, s.start(t, "t1", "go"))
	if !lost {
		t.Fatal("the Ask was never run")
	}
	if n := count(rec, event.TypeApprovalRequested); n != 1 {
		t.Errorf("the person was asked %d times; want once", n)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeApprovalExpired || rec.Status != budget.StatusCompleted {
		t.Errorf("turn %s (%s), calls %+v; want the call expired once, the turn answered", rec.Status, rec.Message, rec.ToolCalls)
	}
}
