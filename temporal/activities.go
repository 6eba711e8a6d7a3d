package temporal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// activities are a worker's side of a turn: each runs one unit of the
// turn's work with the worker's agent, emitting its events to the store
// (numbered by the store, seq 0: units of one turn emit from several
// workers at once) and heartbeating all the while.
type activities struct {
	agent     *agent.Agent
	store     store.Store
	heartbeat time.Duration
	log       *slog.Logger
}

// thought is what Think returns: the turn's state after the step, and the
// tool calls asked for or, when the turn ended, how.
type thought struct {
	State agent.State      `json:"state"`
	Calls []model.ToolCall `json:"calls,omitempty"`
	End   *Outcome         `json:"end,omitempty"`
}

// Outcome is how a turn ended: the workflow's result.
type Outcome struct {
	TurnID     string            `json:"turn_id"`
	Status     budget.Status     `json:"status"`
	StopReason budget.StopReason `json:"stop_reason"`
	// Messages are what the turn added to its session's conversation.
	Messages []model.Message `json:"messages,omitempty"`
}

// callIn is the input of Call, Refuse and Lost.
type callIn struct {
	State  agent.State    `json:"state"`
	Step   int            `json:"step"`
	CallID string         `json:"call_id"`
	Call   model.ToolCall `json:"call"`
	// Reason is Refuse's refusal reason.
	Reason string `json:"reason,omitempty"`
	// Started and Why are Lost's: when the lost call started, and what
	// was lost.
	Started time.Time `json:"started,omitzero"`
	Why     string    `json:"why,omitempty"`
}

// endIn is the input of End.
type endIn struct {
	State   agent.State       `json:"state"`
	Reason  budget.StopReason `json:"reason"`
	Cause   *agent.Cause      `json:"cause,omitempty"`
	Refused int               `json:"refused,omitempty"`
}

// Begin begins the turn: its record in the store (unless the runner that
// started it stored it) and turn_started.
func (x *activities) Begin(ctx context.Context, in agent.Input) (*agent.State, error) {
	err := x.store.BeginTurn(ctx, store.TurnStart{TurnID: in.TurnID, SessionID: in.SessionID, Engine: Engine,
		Agent: x.agent.Name(), Input: in.Text, StartedAt: time.Now()})
	if err != nil && !errors.Is(err, store.ErrExists) {
		return nil, fmt.Errorf("storing turn %s: %w", in.TurnID, err)
	}
	sink := x.sink(ctx)
	s := x.agent.Begin(in, sink)
	return s, sink.flush(ctx)
}

// Think makes the turn's next model step (agent.Think) and, when the turn
// ends there, stores its record.
func (x *activities) Think(ctx context.Context, s *agent.State) (*thought, error) {
	ctx, done := x.unit(ctx, s.TurnID)
	defer done()
	sink := x.sink(ctx)
	calls, res := x.agent.Think(ctx, s, sink)
	out := &thought{State: *s, Calls: calls}
	if res != nil {
		end, err := x.finish(ctx, sink, res)
		if err != nil {
			return nil, err
		}
		out.End = end
	}
	return out, sink.flush(ctx)
}

// Call runs one tool call (agent.Call). A progress report is a heartbeat
// with its details.
func (x *activities) Call(ctx context.Context, in *callIn) (*agent.Called, error) {
	ctx, done := x.unit(ctx, in.State.TurnID)
	defer done()
	sink := x.sink(ctx)
	out := x.agent.Call(ctx, &in.State, in.Step, in.CallID, in.Call, sink)
	return &out, sink.flush(ctx)
}

// Refuse records a call that is not run (agent.Refuse).
func (x *activities) Refuse(ctx context.Context, in *callIn) (*agent.Called, error) {
	sink := x.sink(ctx)
	out := x.agent.Refuse(&in.State, in.Step, in.CallID, in.Call, in.Reason, sink)
	return &out, sink.flush(ctx)
}

// Lost records a call whose worker was lost (agent.Lost).
func (x *activities) Lost(ctx context.Context, in *callIn) (*agent.Called, error) {
	sink := x.sink(ctx)
	out := x.agent.Lost(&in.State, in.Step, in.CallID, in.Call, in.Started, in.Why, sink)
	return &out, sink.flush(ctx)
}

// End ends a turn stopped between units of work (agent.End) and stores
// its record.
func (x *activities) End(ctx context.Context, in *endIn) (*Outcome, error) {
	sink := x.sink(ctx)
	res := x.agent.End(&in.State, in.Reason, in.Cause, in.Refused, sink)
	return x.finish(ctx, sink, res)
}

// finish stores an ended turn's record, with its events as the store
// numbered them, and its messages.
func (x *activities) finish(ctx context.Context, sink *storeSink, res *agent.Result) (*Outcome, error) {
	if err := sink.flush(ctx); err != nil {
		return nil, err
	}
	rec := res.Record
	evs, err := x.store.Events(ctx, rec.TurnID, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the events of turn %s: %w", rec.TurnID, err)
	}
	rec.Events = evs
	if err := x.store.FinishTurn(ctx, rec, res.Messages); err != nil && !errors.Is(err, store.ErrNotRunning) {
		return nil, fmt.Errorf("storing the record of turn %s: %w", rec.TurnID, err)
	}
	return &Outcome{TurnID: rec.TurnID, Status: rec.Status, StopReason: rec.StopReason, Messages: res.Messages}, nil
}

// unit starts what every long unit of work runs beside it: a heartbeat on
// a fixed cadence, so that Temporal notices a dead worker within the
// heartbeat timeout (and delivers a cancellation of the activity), and a
// watch on the store's cancel requests, which reach the unit at once
// rather than at its next heartbeat. The returned context is cancelled by
// either.
func (x *activities) unit(ctx context.Context, turnID string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	requested, unwatch := x.store.WatchCancel(turnID)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Temporal sends at most one heartbeat per 80% of the timeout;
		// beating more often only keeps the latest details fresh.
		tick := time.NewTicker(x.heartbeat / 3)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				activity.RecordHeartbeat(ctx)
			case <-requested:
				cancel(&budget.CancelError{Reason: budget.Cancelled, By: "a client"})
			case <-quit:
				return
			}
		}
	}()
	return ctx, func() {
		close(quit)
		wg.Wait()
		unwatch()
		cancel(nil)
	}
}

func (x *activities) sink(ctx context.Context) *storeSink {
	return &storeSink{ctx: ctx, s: x.store, log: x.log, inActivity: activity.IsActivity(ctx)}
}

// storeSink writes a unit's events to the store, numbered by the store:
// those that carry a call record before the unit goes on, the rest
// queued (store.Recorder). A tool_progress event is also a heartbeat
// with the progress as its details. Late results of abandoned calls
// update their stored records.
type storeSink struct {
	ctx        context.Context
	s          store.Store
	log        *slog.Logger
	inActivity bool

	mu  sync.Mutex
	err error
}

// progressDetails are a heartbeat's details for a progress report.
type progressDetails struct {
	CallID   string   `json:"call_id"`
	Progress *float64 `json:"progress,omitempty"`
	Total    *float64 `json:"total,omitempty"`
	Message  string   `json:"message,omitempty"`
}

// Emit implements event.Sink.
func (k *storeSink) Emit(e event.Event) {
	if p, ok := e.Data.(*event.ToolProgress); ok && k.inActivity {
		activity.RecordHeartbeat(k.ctx, progressDetails{CallID: p.CallID, Progress: p.Progress, Total: p.Total, Message: p.Message})
	}
	e.Seq = 0
	if store.WaitForStore(e) {
		k.fail(k.s.AppendEvent(context.WithoutCancel(k.ctx), e))
		return
	}
	k.s.QueueEvent(e, k.fail)
}

// LateResult implements event.LateSink.
func (k *storeSink) LateResult(rec event.ToolCall) {
	if err := k.s.UpdateToolCall(context.Background(), rec); err != nil {
		k.log.Error("storing a late result", "turn_id", rec.TurnID, "call_id", rec.CallID, "err", err)
	}
}

func (k *storeSink) fail(err error) {
	if err == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		k.err = err
	}
}

// flush returns once every event is stored, with the first write error.
func (k *storeSink) flush(ctx context.Context) error {
	k.fail(k.s.Flush(context.WithoutCancel(ctx)))
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return fmt.Errorf("storing events: %w", k.err)
	}
	return nil
}
