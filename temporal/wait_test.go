package temporal

import (
	"cmp"
	"context"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/store"
)

// TestWaitingForAWorker: work no worker has taken — a scheduled workflow
// task, a scheduled activity (a retry from its next attempt) — is noted
// once per wait, WorkerWait after it began, by a still_working notice
// naming the task queue; work a worker runs is not. (A turn whose every
// worker died showed its call running on, and said nothing.)
func TestWaitingForAWorker(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	taken := &workflowservice.DescribeWorkflowExecutionResponse{
		PendingWorkflowTask: &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_STARTED, ScheduledTime: ts(0)},
		PendingActivities:   []*workflowpb.PendingActivityInfo{{State: enums.PENDING_ACTIVITY_STATE_STARTED, ScheduledTime: ts(0)}},
	}
	if got := waitingSince(taken); !got.IsZero() {
		t.Errorf("work taken by workers waits since %v", got)
	}
	waiting := &workflowservice.DescribeWorkflowExecutionResponse{
		PendingWorkflowTask: &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED, ScheduledTime: ts(5 * time.Second)},
		PendingActivities: []*workflowpb.PendingActivityInfo{
			{State: enums.PENDING_ACTIVITY_STATE_STARTED, ScheduledTime: ts(0)},
			{State: enums.PENDING_ACTIVITY_STATE_SCHEDULED, ScheduledTime: ts(time.Second), NextAttemptScheduleTime: ts(3 * time.Second)},
		},
	}
	if got := waitingSince(waiting); !got.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("waiting since %v, want the retry's next attempt, %v", got, t0.Add(3*time.Second))
	}

	ctx := context.Background()
	m := store.NewMemory()
	if err := m.BeginTurn(ctx, store.TurnStart{TurnID: "t1", StartedAt: t0}); err != nil {
		t.Fatal(err)
	}
	f := &follow{r: &Runner{store: m, taskQueue: "tq"}, in: agent.Input{TurnID: "t1"},
		events: []event.Event{{Type: event.TypeToolStarted, Data: &event.ToolStarted{Step: 2, CallID: "call_2_1", Tool: "hang"}}}}
	since := t0.Add(3 * time.Second)
	for _, at := range []time.Duration{WorkerWait - time.Second, WorkerWait + time.Second, WorkerWait + 5*time.Second} {
		f.noteWait(ctx, since, since.Add(at))
	}
	f.noteWait(ctx, since.Add(time.Minute), since.Add(time.Minute+WorkerWait)) // a second wait
	evs, err := m.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("%d events, want a notice for each of the two waits: %+v", len(evs), evs)
	}
	n, ok := evs[0].Data.(*event.StillWorking)
	if !ok || n.Step != 2 || n.ElapsedMS != (WorkerWait+time.Second).Milliseconds() ||
		!strings.Contains(n.Waiting, `no timebox worker has taken this turn's work for 11s. Is one running on task queue "tq"`) {
		t.Errorf("notice %+v", evs[0].Data)
	}
}

// TestUnworkedPast: the follower takes a turn for past its ceiling or
// its step window with no worker to stop it only once its work has waited
// WorkerWait, no worker has any of it in hand, and the first to fall of
// its ceiling — moved by its waits for nothing but people — and the end
// of its step window — its last progress signal plus timeouts.step, or a
// running call's own deadline — and its kill grace are CeilingGrace
// behind. A turn waiting for a person now is past neither; while a call
// waits for one, or an advisory call runs, the step window does not end
// (the ceiling may still fall). Whichever fell first is the stop.
func TestUnworkedPast(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(at(d)) }
	waiting := &workflowservice.DescribeWorkflowExecutionResponse{
		PendingWorkflowTask: &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED, ScheduledTime: ts(2 * time.Second)},
	}
	taken := &workflowservice.DescribeWorkflowExecutionResponse{
		PendingWorkflowTask: &workflowpb.PendingWorkflowTaskInfo{State: enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED, ScheduledTime: ts(2 * time.Second)},
		PendingActivities:   []*workflowpb.PendingActivityInfo{{State: enums.PENDING_ACTIVITY_STATE_STARTED, ScheduledTime: ts(0)}},
	}
	ev := func(d time.Duration, data event.Payload) event.Event {
		return event.Event{At: at(d), Type: data.Type(), Data: data}
	}
	started := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ToolStarted{CallID: id, Tool: "t"})
	}
	// until: a call with its own timeout, to deadline.
	until := func(d time.Duration, id string, deadline time.Duration) event.Event {
		return ev(d, &event.ToolStarted{CallID: id, Tool: "t", Deadline: at(deadline)})
	}
	advisory := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ToolStarted{CallID: id, Tool: "t", Deadline: at(d + time.Second), Enforcement: budget.Advisory})
	}
	report := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ToolProgress{CallID: id, Tool: "t"})
	}
	answered := func(d time.Duration) event.Event { return ev(d, &event.LLMFinished{ToolCalls: 1}) }
	asked := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ApprovalRequested{CallID: id, Tool: "t"})
	}
	decided := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ApprovalDecided{CallID: id, Decision: event.Approve})
	}
	// Past a fall at d: its kill grace (500ms) and CeilingGrace after it.
	grace := 500*time.Millisecond + CeilingGrace
	// The ceiling at 10s (of the cases without a turn of their own) is
	// past at 10s + grace.
	late := 10*time.Second + grace
	for _, tc := range []struct {
		name   string
		turn   time.Duration // 0: 10s
		step   time.Duration // 0: off
		d      *workflowservice.DescribeWorkflowExecutionResponse
		events []event.Event
		since  time.Duration
		now    time.Duration
		reason budget.StopReason // "": past neither
		fell   time.Duration
	}{
		{name: "past", d: waiting, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: late,
			reason: budget.TurnTimeout, fell: 10 * time.Second},
		{name: "within the grace", d: waiting, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: late - time.Millisecond},
		{name: "work in a worker's hands", d: taken, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: time.Minute},
		{name: "work waiting less than WorkerWait", d: waiting, since: time.Minute - WorkerWait + time.Millisecond, now: time.Minute},
		{name: "no work waiting", d: waiting, now: time.Minute},
		{name: "a wait for a person moved it", d: waiting,
			events: []event.Event{asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  8 * time.Second, now: late + 6*time.Second, reason: budget.TurnTimeout, fell: 16 * time.Second},
		{name: "moved, within the grace", d: waiting,
			events: []event.Event{asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  8 * time.Second, now: late + 6*time.Second - time.Millisecond},
		{name: "waiting for a person now", d: waiting, events: []event.Event{asked(time.Second, "a")}, since: 2 * time.Second, now: time.Hour},
		{name: "a wait while another call works", d: waiting,
			events: []event.Event{started(500*time.Millisecond, "b"), asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  2 * time.Second, now: late, reason: budget.TurnTimeout, fell: 10 * time.Second},

		// The step window (15s, of a turn of 1m), from the last progress
		// signal.
		{name: "step: past", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second)},
			since:  2 * time.Second, now: 16*time.Second + grace, reason: budget.NoProgress, fell: 16 * time.Second},
		{name: "step: within the grace", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second)},
			since:  2 * time.Second, now: 16*time.Second + grace - time.Millisecond},
		{name: "step: from the turn's start", turn: time.Minute, step: 15 * time.Second, d: waiting,
			since: time.Second, now: 15*time.Second + grace, reason: budget.NoProgress, fell: 15 * time.Second},
		{name: "step: work in a worker's hands", turn: time.Minute, step: 15 * time.Second, d: taken,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second)}, since: 2 * time.Second, now: 50 * time.Second},
		{name: "step: a tool's report moved it", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second), report(3*time.Second, "a")},
			since:  4 * time.Second, now: 18*time.Second + grace, reason: budget.NoProgress, fell: 18 * time.Second},
		{name: "step: moved, within the grace", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second), report(3*time.Second, "a")},
			since:  4 * time.Second, now: 18*time.Second + grace - time.Millisecond},
		{name: "step: a call inside its own timeout", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 40*time.Second)},
			since:  2 * time.Second, now: 40*time.Second + grace, reason: budget.NoProgress, fell: 40 * time.Second},
		{name: "step: inside its own timeout, within the grace", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 40*time.Second)},
			since:  2 * time.Second, now: 40*time.Second + grace - time.Millisecond},
		{name: "step: a call that ended is progress", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second),
				ev(2*time.Second, &event.ToolFinished{ToolCall: event.ToolCall{CallID: "a", Tool: "t"}})},
			since: 3 * time.Second, now: 17*time.Second + grace, reason: budget.NoProgress, fell: 17 * time.Second},
		{name: "step: an advisory call runs", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), advisory(time.Second, "a")},
			since:  2 * time.Second, now: time.Minute + grace, reason: budget.TurnTimeout, fell: time.Minute},
		{name: "step: an advisory call runs, before the ceiling", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), advisory(time.Second, "a")},
			since:  2 * time.Second, now: time.Minute + grace - time.Millisecond},
		{name: "step: a call waits for a person while another works", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "b", 2*time.Second), asked(time.Second, "a")},
			since:  2 * time.Second, now: time.Minute + grace, reason: budget.TurnTimeout, fell: time.Minute},
		{name: "step: waiting for a person now", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), asked(time.Second, "a")}, since: 2 * time.Second, now: time.Hour},
		{name: "step: a decision is progress", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), asked(time.Second, "a"), decided(7*time.Second, "a"), until(7*time.Second, "a", 8*time.Second)},
			since:  8 * time.Second, now: 22*time.Second + grace, reason: budget.NoProgress, fell: 22 * time.Second},
		{name: "step: the ceiling fell first", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(50 * time.Second), until(50*time.Second, "a", 51*time.Second)},
			since:  51 * time.Second, now: 2 * time.Minute, reason: budget.TurnTimeout, fell: time.Minute},
		{name: "step: the step fell first", turn: time.Minute, step: 15 * time.Second, d: waiting,
			events: []event.Event{answered(time.Second), until(time.Second, "a", 2*time.Second)},
			since:  2 * time.Second, now: 2 * time.Minute, reason: budget.NoProgress, fell: 16 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &machine.State{Start: t0}
			s.Budgets.Turn = budget.Duration{D: cmp.Or(tc.turn, 10*time.Second)}
			s.Budgets.Step = budget.Duration{D: tc.step}
			s.Budgets.KillGrace = budget.Duration{D: 500 * time.Millisecond}
			f := &follow{state: s, events: tc.events}
			var since time.Time
			if tc.since > 0 {
				since = at(tc.since)
			}
			fl, past := f.unworkedPast(tc.d, since, at(tc.now))
			switch {
			case tc.reason == "" && past:
				t.Errorf("past its %s (at %v) at %v", fl.reason, fl.at.Sub(t0), tc.now)
			case tc.reason != "" && (!past || fl.reason != tc.reason || !fl.at.Equal(at(tc.fell))):
				t.Errorf("past: %v, %s at %v; want past, %s at %v", past, fl.reason, fl.at.Sub(t0), tc.reason, tc.fell)
			}
		})
	}
}

// terminating is a Temporal client that only terminates workflows, and
// notes which.
type terminating struct {
	client.Client
	terminated []string
}

func (c *terminating) TerminateWorkflow(_ context.Context, workflowID, _, _ string, _ ...any) error {
	c.terminated = append(c.terminated, workflowID)
	return nil
}

// TestStopEndSays: the end of a turn past a budget no worker ran it to
// enforce says what the embedded engine's would, from the turn's events:
// a compaction running (and its flag), a model call waiting for its reply
// or streaming it, the last step and how long ago it finished, the calls
// running, and a compaction that timed out earlier (its flag). (It said
// "model m" whenever no call ran, and never flagged a compaction.)
func TestStopEndSays(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ev := func(d time.Duration, data event.Payload) event.Event {
		return event.Event{At: at(d), Type: data.Type(), Data: data}
	}
	asked := func(d time.Duration) event.Event { return ev(d, &event.LLMStarted{Step: 1, Model: "m", Attempt: 1}) }
	answered := func(d time.Duration) event.Event { return ev(d, &event.LLMFinished{ToolCalls: 1}) }
	started := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ToolStarted{CallID: id, Tool: "t"})
	}
	finished := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ToolFinished{ToolCall: event.ToolCall{CallID: id, Tool: "t"}})
	}
	compacting := func(d time.Duration) event.Event { return ev(d, &event.CompactionStarted{Step: 2, Attempt: 1}) }
	a := newAgent(t, `{"text": "unused"}`+"\n", budget.Budgets{}, budget.Limits{})
	byTurn := event.Flags{TimedOutByTurnBudget: true}
	for _, tc := range []struct {
		name    string
		reason  budget.StopReason // "": turn_timeout, at 10s
		fell    time.Duration
		events  []event.Event
		running []event.ToolCall
		last    string
		flags   event.Flags
	}{
		{name: "a compaction runs", events: []event.Event{asked(time.Second), answered(2 * time.Second), started(2*time.Second, "a"),
			finished(3*time.Second, "a"), compacting(4 * time.Second)},
			last: "compaction (model m), waiting for its reply (6s)", flags: event.Flags{TimedOutByTurnBudget: true, TimedOutDuringCompaction: true}},
		{name: "a compaction runs, step", reason: budget.NoProgress, fell: 7 * time.Second,
			events: []event.Event{asked(time.Second), answered(2 * time.Second), started(2*time.Second, "a"), finished(4*time.Second, "a"),
				compacting(4 * time.Second)},
			last: "compaction (model m), waiting for its reply (3s)", flags: event.Flags{TimedOutDuringCompaction: true}},
		{name: "a model call waits for its reply", events: []event.Event{asked(4 * time.Second)},
			last: "model m, waiting for its reply (6s)", flags: byTurn},
		{name: "a model call streams its reply", events: []event.Event{asked(4 * time.Second), ev(5*time.Second, &event.LLMDelta{Step: 1, Text: "x"})},
			last: "model m, streaming its reply (6s)", flags: byTurn},
		{name: "nothing runs", events: []event.Event{asked(time.Second), answered(2 * time.Second), started(2*time.Second, "a"), finished(3*time.Second, "a")},
			last: "tool t, finished 7s ago", flags: byTurn},
		{name: "a call runs", events: []event.Event{asked(time.Second), answered(2 * time.Second), started(2*time.Second, "a")},
			running: []event.ToolCall{{CallID: "a", Tool: "t", StartedAt: at(2 * time.Second)}},
			last:    "tool t, running for 8s", flags: event.Flags{TimedOutByTurnBudget: true, TimedOutDuringToolExecution: true}},
		{name: "a compaction timed out before", events: []event.Event{compacting(time.Second),
			ev(2*time.Second, &event.CompactionFinished{Step: 1, Outcome: event.OutcomeTimedOut, Phase: budget.PhaseCompaction}), asked(3 * time.Second)},
			last: "model m, waiting for its reply (7s)", flags: event.Flags{TimedOutByTurnBudget: true, TimedOutDuringCompaction: true}},
		{name: "nothing ran", last: "none", flags: byTurn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &machine.State{TurnID: "turn_1", Start: t0}
			s.Budgets.Turn = budget.Duration{D: 10 * time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
			s.Budgets.Step = budget.Duration{D: 3 * time.Second, Source: budget.SourceFile, Knob: budget.KeyStep}
			fl := fall{reason: budget.TurnTimeout, at: at(10 * time.Second)}
			if tc.reason != "" {
				fl = fall{reason: tc.reason, at: at(tc.fell), progressed: at(tc.fell - 3*time.Second)}
			}
			c := &terminating{}
			r := &Runner{client: c, taskQueue: "q", agent: a}
			end := r.stopEnd(context.Background(), s, tc.events, fl, 11*time.Second, fl.at.Add(6*time.Second))
			got := end.Stop(tc.running)
			if !strings.Contains(got.Message, "Last step: "+tc.last+".") || got.Flags != tc.flags {
				t.Errorf("flags %+v, message %q; want flags %+v, last step %q", got.Flags, got.Message, tc.flags, tc.last)
			}
			if len(c.terminated) != 1 || c.terminated[0] != WorkflowID(s.TurnID) {
				t.Errorf("terminated %v", c.terminated)
			}
		})
	}
}
