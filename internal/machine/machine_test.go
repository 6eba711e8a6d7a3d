package machine

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
)

func limits(steps, calls, parallel int64) budget.Limits {
	return budget.Limits{MaxSteps: budget.Count{N: steps}, MaxToolCalls: budget.Count{N: calls}, ParallelTools: budget.Count{N: parallel}}
}

// TestNext: what a turn does next, for each state that decides it, in the
// order the turn meets them.
func TestNext(t *testing.T) {
	ceiling := &Cause{Timeout: &budget.TimeoutError{Phase: budget.PhaseTurn}}
	cancel := &Cause{Cancel: &budget.CancelError{Reason: budget.ClientGone}}
	answered := &Ending{Reason: budget.Answered}
	batch := []Call{{Index: 0, Name: "a"}}
	base := State{Begun: true, Limits: limits(3, 10, 2)}
	for _, tc := range []struct {
		name string
		set  func(*State)
		want Unit
	}{
		{"not begun", func(s *State) { s.Begun = false }, Unit{Kind: Begin}},
		{"stopped before it began: ended (its End begins it)", func(s *State) { s.Begun, s.Stop = false, ceiling },
			Unit{Kind: End, End: &Ending{Reason: budget.TurnTimeout, Cause: ceiling}}},
		{"first step", func(*State) {}, Unit{Kind: Think, Step: 1}},
		{"a unit ended it", func(s *State) { s.End, s.Batch = answered, batch }, Unit{Kind: End, End: answered}},
		{"calls asked for run, stopped or not", func(s *State) { s.Steps, s.Batch, s.Stop = 1, batch, ceiling },
			Unit{Kind: Tools, Step: 1, Calls: batch}},
		{"stopped by its ceiling", func(s *State) { s.Stop = ceiling }, Unit{Kind: End, End: &Ending{Reason: budget.TurnTimeout, Cause: ceiling}}},
		{"its client went away", func(s *State) { s.Stop, s.Refused = cancel, 2 },
			Unit{Kind: End, End: &Ending{Reason: budget.ClientGone, Cause: cancel}}},
		{"max_tool_calls refused calls", func(s *State) { s.Refused = 2 }, Unit{Kind: End, End: &Ending{Reason: budget.MaxToolCalls, Refused: 2}}},
		{"refused as too long: compact, forced", func(s *State) { s.Steps, s.TooLong = 3, &Cause{Text: "long"} },
			Unit{Kind: Compact, Step: 4, Force: true}},
		{"max_steps", func(s *State) { s.Steps, s.CompactDue = 3, true }, Unit{Kind: End, End: &Ending{Reason: budget.MaxSteps}}},
		{"llm_budget spent", func(s *State) { s.Budgets.LLMBudget, s.LLMUsed = budget.Duration{D: time.Second}, time.Second },
			Unit{Kind: End, End: &Ending{Reason: budget.LLMBudgetExhausted}}},
		{"llm_budget left", func(s *State) { s.Budgets.LLMBudget, s.LLMUsed = budget.Duration{D: time.Second}, time.Millisecond },
			Unit{Kind: Think, Step: 1}},
		{"a compaction due", func(s *State) { s.Steps, s.CompactDue = 1, true }, Unit{Kind: Compact, Step: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.set(&s)
			if diff := cmp.Diff(tc.want, Next(&s)); diff != "" {
				t.Errorf("Next (-want +got):\n%s", diff)
			}
		})
	}
}

// fake is a Driver that runs units by hand: think decides what a Think
// does; calls and refusals are recorded.
type fake struct {
	now     time.Time
	stopped *Cause // what Check notes
	think   func(*State)
	pause   int // Check returns false on this call, from 1

	mu      sync.Mutex
	checks  int
	units   []Kind
	called  []string
	refused map[string]string
	// refusals counts the Refuse calls.
	refusals int
	running  int // calls running at once now
	most     int // and at most
	started  chan struct{}
	release  chan struct{}

	// approve decides the calls that need a person, by name; each waits
	// wait for the decision.
	approve map[string]bool
	wait    time.Duration
	pauses  []string // what Paused was told
	clock   sync.Mutex
}

func (f *fake) Now() time.Time {
	f.clock.Lock()
	defer f.clock.Unlock()
	return f.now
}

func (f *fake) Asks(s *State, c Call) bool {
	_, ok := f.approve[c.Name]
	return ok
}

func (f *fake) Approve(s *State, step int, c Call) (bool, Called) {
	f.clock.Lock()
	f.now = f.now.Add(f.wait)
	f.clock.Unlock()
	if f.approve[c.Name] {
		return true, Called{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused == nil {
		f.refused = map[string]string{}
	}
	f.refused[c.Name] = "denied"
	return false, Called{}
}

func (f *fake) Paused(paused bool, ceiling time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if paused {
		f.pauses = append(f.pauses, "paused")
		return
	}
	f.pauses = append(f.pauses, "ceiling "+ceiling.Format(time.TimeOnly))
}

func (f *fake) Check(s *State) bool {
	f.checks++
	if f.stopped != nil && s.Stop == nil {
		s.Stop = f.stopped
	}
	return f.checks != f.pause
}

func (f *fake) Run(s *State, u Unit) {
	f.units = append(f.units, u.Kind)
	switch u.Kind {
	case Begin:
		s.Begun = true
	case Think:
		s.Steps = u.Step
		f.think(s)
	case Compact:
		s.CompactDue = false
	}
}

func (f *fake) Call(s *State, step int, c Call) Called {
	f.mu.Lock()
	f.called = append(f.called, c.Name)
	f.running++
	f.most = max(f.most, f.running)
	f.mu.Unlock()
	if f.release != nil {
		f.started <- struct{}{}
		<-f.release
	}
	f.mu.Lock()
	f.running--
	f.mu.Unlock()
	return Called{}
}

func (f *fake) Refuse(s *State, step int, cs []Call, reason string) []Called {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused == nil {
		f.refused = map[string]string{}
	}
	for _, c := range cs {
		f.refused[c.Name] = reason
	}
	f.refusals++
	return make([]Called, len(cs))
}

func (f *fake) Group(slots int) Group {
	f.clock.Lock()
	f.now = f.now.Add(3 * time.Second) // the batch takes 3s
	f.clock.Unlock()
	return &fakeGroup{f: f, sem: make(chan struct{}, slots)}
}

type fakeGroup struct {
	f   *fake
	sem chan struct{}
	wg  sync.WaitGroup
}

func (g *fakeGroup) Acquire() bool { g.sem <- struct{}{}; return true }
func (g *fakeGroup) Release()      { <-g.sem }
func (g *fakeGroup) Go(f func(Driver)) {
	g.wg.Add(1)
	go func() { defer g.wg.Done(); f(g.f) }()
}
func (g *fakeGroup) Wait() { g.wg.Wait() }

// asks returns a Think that asks for the named calls, then answers.
func asks(batches ...[]string) func(*State) {
	return func(s *State) {
		s.Messages++
		if len(batches) == 0 {
			s.End = &Ending{Reason: budget.Answered}
			return
		}
		b := batches[0]
		batches = batches[1:]
		for i, n := range b {
			s.Batch = append(s.Batch, Call{Index: i, Name: n})
		}
	}
}

// TestDrive drives a turn through two batches to its answer: the units in
// order, each call run, the batch's time and messages counted.
func TestDrive(t *testing.T) {
	f := &fake{think: asks([]string{"a", "b"}, []string{"c"})}
	s := &State{Limits: limits(10, 10, 4), Messages: 1}
	end := Drive(f, s)
	if end.Kind != End || end.End.Reason != budget.Answered {
		t.Fatalf("Drive ended with %+v", end)
	}
	if want := []Kind{Begin, Think, Think, Think}; !cmp.Equal(f.units, want) {
		t.Errorf("units %v, want %v", f.units, want)
	}
	if len(f.called) != 3 || s.ToolCalls != 3 || s.Messages != 1+3+3 || s.ToolTime != 6*time.Second || s.Batch != nil {
		t.Errorf("called %v; state: %d calls, %d messages, tool time %v, batch %v", f.called, s.ToolCalls, s.Messages, s.ToolTime, s.Batch)
	}
}

// TestRunBatchLimits: calls past max_tool_calls are refused (and end the
// turn), at most parallel_tools run at once, and a stop refuses the calls
// not yet started.
func TestRunBatchLimits(t *testing.T) {
	t.Run("max_tool_calls", func(t *testing.T) {
		f := &fake{}
		s := &State{Begun: true, Limits: limits(10, 3, 4), ToolCalls: 1, Messages: 2}
		RunBatch(f, s, Unit{Kind: Tools, Step: 2, Calls: []Call{{Index: 0, Name: "a"}, {Index: 1, Name: "b"}, {Index: 2, Name: "c"}, {Index: 3, Name: "d"}}})
		if !cmp.Equal(f.refused, map[string]string{"c": RefusedLimit, "d": RefusedLimit}) || s.Refused != 2 || s.ToolCalls != 3 {
			t.Errorf("refused %v; state refused %d, calls %d", f.refused, s.Refused, s.ToolCalls)
		}
		if f.refusals != 1 {
			t.Errorf("the calls past max_tool_calls were refused in %d Refuse calls, want 1", f.refusals)
		}
		if u := Next(s); u.Kind != End || u.End.Reason != budget.MaxToolCalls {
			t.Errorf("next: %+v", u)
		}
	})
	t.Run("parallel_tools", func(t *testing.T) {
		f := &fake{started: make(chan struct{}), release: make(chan struct{})}
		s := &State{Begun: true, Limits: limits(10, 10, 2)}
		done := make(chan struct{})
		go func() {
			RunBatch(f, s, Unit{Kind: Tools, Step: 1, Calls: []Call{{Index: 0, Name: "a"}, {Index: 1, Name: "b"}, {Index: 2, Name: "c"}}})
			close(done)
		}()
		<-f.started
		<-f.started // two run; the third waits for a slot
		f.mu.Lock()
		running := f.running
		f.mu.Unlock()
		f.release <- struct{}{}
		<-f.started
		f.release <- struct{}{}
		f.release <- struct{}{}
		<-done
		if running != 2 || f.most != 2 {
			t.Errorf("%d calls ran at once, at most %d; want 2", running, f.most)
		}
	})
	t.Run("stopped", func(t *testing.T) {
		f := &fake{}
		ce := &Cause{Cancel: &budget.CancelError{Reason: budget.Cancelled}}
		s := &State{Begun: true, Limits: limits(10, 10, 4), Stop: ce}
		RunBatch(f, s, Unit{Kind: Tools, Step: 1, Calls: []Call{{Index: 0, Name: "a"}, {Index: 1, Name: "b"}}})
		if len(f.called) != 0 || !cmp.Equal(f.refused, map[string]string{"a": RefusedCancelled, "b": RefusedCancelled}) {
			t.Errorf("called %v, refused %v", f.called, f.refused)
		}
		if u := Next(s); u.Kind != End || u.End.Reason != budget.Cancelled {
			t.Errorf("next: %+v", u)
		}
	})
}

// TestDrivePause: a Check that says stop here leaves the turn where it is,
// for an engine to drive it on elsewhere from the same state.
func TestDrivePause(t *testing.T) {
	f := &fake{think: asks([]string{"a"}), pause: 3}
	s := &State{Limits: limits(10, 10, 4)}
	if u := Drive(f, s); u.Kind != 0 {
		t.Fatalf("Drive returned %+v, want the zero Unit", u)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var again State
	if err := json.Unmarshal(b, &again); err != nil {
		t.Fatal(err)
	}
	f.pause = 0
	if u := Drive(f, &again); u.Kind != End || u.End.Reason != budget.Answered {
		t.Fatalf("driven on: %+v", u)
	}
	if want := []Kind{Begin, Think, Think}; !cmp.Equal(f.units, want) || len(f.called) != 1 {
		t.Errorf("units %v, calls %v", f.units, f.called)
	}
}

// TestStateJSON: a State comes back from JSON whole, its budgets with
// their sources and knobs.
func TestStateJSON(t *testing.T) {
	s := State{TurnID: "t1", Start: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Begun: true, Steps: 2, Messages: 5,
		Budgets:  budget.Budgets{Turn: budget.Duration{D: time.Minute, Source: budget.SourceRequest, Knob: "timeouts.turn"}},
		Limits:   budget.Limits{MaxSteps: budget.Count{N: 7, Source: budget.SourceFlag, Knob: "limits.max_steps"}},
		Batch:    []Call{{Index: 1, Name: "x"}},
		Stop:     CauseOf(&budget.CancelError{Reason: budget.ClientGone, By: "the client"}),
		Stopped:  &StopNote{Desc: "tool x, running for 2s", Tools: []string{"x"}, DuringRun: true},
		Agent:    &AgentRef{Name: "a", Origin: "a.yaml", Fingerprint: "f"},
		Seen:     12,
		Attempts: 2,
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got State
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Budgets.Turn != s.Budgets.Turn || got.Limits.MaxSteps != s.Limits.MaxSteps {
		t.Errorf("budgets: %+v %+v", got.Budgets.Turn, got.Limits.MaxSteps)
	}
	got.Budgets, got.Limits = s.Budgets, s.Limits
	if diff := cmp.Diff(s, got); diff != "" {
		t.Errorf("(-sent +received):\n%s", diff)
	}
}

// TestCause: a Cause gives back the error it was made from, as the
// messages read it, and cuts long texts.
func TestCause(t *testing.T) {
	me := &model.Error{Provider: "openai", Status: 400, Message: "too long", TooLong: true}
	var back *model.Error
	if err := CauseOf(me).Err(); !errors.As(err, &back) || back.Status != 400 || !back.TooLong {
		t.Errorf("a model error came back as %#v", err)
	}
	if got := StopReasonOf(CauseOf(&budget.TimeoutError{Phase: budget.PhaseStep}).Err()); got != budget.NoProgress {
		t.Errorf("a step timeout stops %s", got)
	}
	if got := StopReasonOf(errors.New("context canceled")); got != budget.Cancelled {
		t.Errorf("a bare cancellation stops %s", got)
	}
	long := make([]byte, 100<<10)
	for i := range long {
		long[i] = 'x'
	}
	if c := CauseOf(errors.New(string(long))); len(c.Text) > maxText+len("…") {
		t.Errorf("a 100 KiB error is carried as %d bytes", len(c.Text))
	}
}

// TestMerge: the notes of calls stopped at once name every tool.
func TestMerge(t *testing.T) {
	var n *StopNote
	n = n.Merge(&StopNote{Desc: "tool a, running for 1s", Tools: []string{"a"}, DuringRun: true})
	n = n.Merge(nil)
	n = n.Merge(&StopNote{Desc: "tool b, running for 2s", Tools: []string{"b"}, DuringRun: true})
	if n.Desc != "tools a, b running" || !n.DuringRun || len(n.Tools) != 2 {
		t.Errorf("merged: %+v", n)
	}
	if CallID(3, 0) != "call_3_1" {
		t.Errorf("CallID(3, 0) = %s", CallID(3, 0))
	}
}

// A call that waits for a person waits without a slot, and the turn's
// ceiling stops only while nothing else works: its time is not the
// turn's, nor the batch's tool time.
func TestRunBatchApprovals(t *testing.T) {
	start := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	turn := budget.Budgets{Turn: budget.Duration{D: time.Minute}}
	t.Run("alone", func(t *testing.T) {
		f := &fake{now: start, approve: map[string]bool{"a": true}, wait: 10 * time.Second}
		s := &State{Begun: true, Start: start, Budgets: turn, Limits: limits(10, 10, 1)}
		RunBatch(f, s, Unit{Kind: Tools, Step: 1, Calls: []Call{{Index: 0, Name: "a"}}})
		if !cmp.Equal(f.called, []string{"a"}) || s.ApprovalWait != 10*time.Second {
			t.Errorf("called %v, waited %s; want [a], 10s", f.called, s.ApprovalWait)
		}
		// The batch began at 10:00:03; the wait moved the ceiling from
		// 10:01:00 to 10:01:10.
		if want := []string{"paused", "ceiling 10:01:10"}; !cmp.Equal(f.pauses, want) {
			t.Errorf("pauses %v, want %v", f.pauses, want)
		}
		if s.ToolTime != 3*time.Second {
			t.Errorf("tool time %s, want the batch's own 3s, without the wait", s.ToolTime)
		}
		if s.Ceiling() != start.Add(70*time.Second) {
			t.Errorf("ceiling %s", s.Ceiling())
		}
	})
	t.Run("denied", func(t *testing.T) {
		f := &fake{now: start, approve: map[string]bool{"a": false}, wait: time.Second}
		s := &State{Begun: true, Start: start, Budgets: turn, Limits: limits(10, 10, 1)}
		RunBatch(f, s, Unit{Kind: Tools, Step: 1, Calls: []Call{{Index: 0, Name: "a"}, {Index: 1, Name: "b"}}})
		if !cmp.Equal(f.called, []string{"b"}) || f.refused["a"] != "denied" || s.ToolCalls != 2 {
			t.Errorf("called %v, refused %v, counted %d", f.called, f.refused, s.ToolCalls)
		}
	})
	t.Run("beside a working call", func(t *testing.T) {
		// b works while a waits: the turn is working, its ceiling runs
		// on, and a does not hold b's only slot.
		f := &fake{now: start, approve: map[string]bool{"a": true}, started: make(chan struct{}), release: make(chan struct{})}
		s := &State{Begun: true, Start: start, Budgets: turn, Limits: limits(10, 10, 1)}
		done := make(chan struct{})
		go func() {
			RunBatch(f, s, Unit{Kind: Tools, Step: 1, Calls: []Call{{Index: 0, Name: "a"}, {Index: 1, Name: "b"}}})
			close(done)
		}()
		<-f.started
		f.release <- struct{}{}
		<-f.started
		f.release <- struct{}{}
		<-done
		if len(f.called) != 2 || s.ApprovalWait != 0 {
			t.Errorf("called %v, waited %s", f.called, s.ApprovalWait)
		}
	})
}

func TestPauses(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	var p Pauses
	p.Change(at(0), 0, 1) // a call works
	p.Change(at(1), 1, 0) // another waits for a person: still working
	if p.Paused() {
		t.Fatal("paused while a call works")
	}
	p.Change(at(3), 0, -1) // the work ends: only a person is awaited
	p.Change(at(10), -1, 0)
	p.Change(at(11), 1, 0)
	p.Change(at(12), -1, 0)
	if p.Paused() || p.Total != 8*time.Second {
		t.Errorf("paused %v, total %s; want false, 8s", p.Paused(), p.Total)
	}
}
