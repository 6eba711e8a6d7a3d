package temporal

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
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

// TestUnworkedPastCeiling: the follower takes a turn for past its ceiling
// with no worker to stop it only once its work has waited WorkerWait, no
// worker has any of it in hand, and its ceiling — moved by its waits for
// nothing but people — and kill grace are CeilingGrace behind; a turn
// waiting for a person now is not past it.
func TestUnworkedPastCeiling(t *testing.T) {
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
	asked := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ApprovalRequested{CallID: id, Tool: "t"})
	}
	decided := func(d time.Duration, id string) event.Event {
		return ev(d, &event.ApprovalDecided{CallID: id, Decision: event.Approve})
	}
	s := &machine.State{Start: t0}
	s.Budgets.Turn = budget.Duration{D: 10 * time.Second}
	s.Budgets.KillGrace = budget.Duration{D: 500 * time.Millisecond}
	// The ceiling at 10s is past at 10s + 500ms + CeilingGrace.
	late := 10*time.Second + 500*time.Millisecond + CeilingGrace
	for _, tc := range []struct {
		name    string
		d       *workflowservice.DescribeWorkflowExecutionResponse
		events  []event.Event
		since   time.Duration
		now     time.Duration
		ceiling time.Duration // 0: not past it
	}{
		{name: "past", d: waiting, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: late, ceiling: 10 * time.Second},
		{name: "within the grace", d: waiting, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: late - time.Millisecond},
		{name: "work in a worker's hands", d: taken, events: []event.Event{started(time.Second, "a")}, since: 2 * time.Second, now: time.Minute},
		{name: "work waiting less than WorkerWait", d: waiting, since: time.Minute - WorkerWait + time.Millisecond, now: time.Minute},
		{name: "no work waiting", d: waiting, now: time.Minute},
		{name: "a wait for a person moved it", d: waiting,
			events: []event.Event{asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  8 * time.Second, now: late + 6*time.Second, ceiling: 16 * time.Second},
		{name: "moved, within the grace", d: waiting,
			events: []event.Event{asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  8 * time.Second, now: late + 6*time.Second - time.Millisecond},
		{name: "waiting for a person now", d: waiting, events: []event.Event{asked(time.Second, "a")}, since: 2 * time.Second, now: time.Hour},
		{name: "a wait while another call works", d: waiting,
			events: []event.Event{started(500*time.Millisecond, "b"), asked(time.Second, "a"), decided(7*time.Second, "a"), started(7*time.Second, "a")},
			since:  2 * time.Second, now: late, ceiling: 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &follow{state: s, events: tc.events}
			var since time.Time
			if tc.since > 0 {
				since = at(tc.since)
			}
			ceiling, past := f.unworkedPastCeiling(tc.d, since, at(tc.now))
			switch {
			case tc.ceiling == 0 && past:
				t.Errorf("past its ceiling (%v) at %v", ceiling.Sub(t0), tc.now)
			case tc.ceiling > 0 && (!past || !ceiling.Equal(at(tc.ceiling))):
				t.Errorf("past: %v, ceiling at %v; want past, at %v", past, ceiling.Sub(t0), tc.ceiling)
			}
		})
	}
}
