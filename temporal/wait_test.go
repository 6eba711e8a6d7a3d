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
	"github.com/timebox-run/timebox/event"
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
