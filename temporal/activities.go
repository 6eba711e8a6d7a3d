package temporal

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/approve"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/store"
)

// activities are a worker's side of a turn: each runs one unit of the
// turn's work with the worker's agent (machine.Units), reading the turn's
// conversation from the store and writing back what it added, emitting its
// events to the store (numbered there: units of one turn emit from several
// workers at once), and heartbeating all the while. Each returns only what
// the workflow needs to go on — never the conversation — so that no
// payload limit of Temporal's bounds a turn.
type activities struct {
	units     machine.Units
	store     store.Store
	payloads  store.Payloads
	heartbeat time.Duration
	log       *slog.Logger
	// under counts the units under way, and spans those between their
	// note that they make their turn's span and its end, for the worker's
	// Stop (relaying.Stop).
	under, spans *counted
	// stopping ends when the worker's Stop gives the units under way up
	// (relaying.handOver), as Temporal's SDK would later: the worker is
	// stopping. Nil for none.
	stopping context.Context
}

// unitIn is the input of every activity: the turn's state, and what the
// unit is.
type unitIn struct {
	State machine.State `json:"state"`
	// Key names the unit's result in the store (keyDone): the workflow's
	// run and the activity's id.
	Key  string       `json:"key,omitempty"`
	Step int          `json:"step,omitempty"`
	Call machine.Call `json:"call"`
	// Calls and Reason are RefuseCalls' (Reason and Call Refuse's): the
	// calls refused, and why.
	Calls  []machine.Call `json:"calls,omitempty"`
	Reason string         `json:"reason,omitempty"`
	// Why, Beat and Noticed are Lost's: what was lost, the lost call's
	// last heartbeat, and when the loss was noticed.
	Why     string    `json:"why,omitempty"`
	Beat    *beat     `json:"beat,omitempty"`
	Noticed time.Time `json:"noticed,omitzero"`
	// End is End's.
	End *machine.Ending `json:"end,omitempty"`
	// Round, Began, Asked, Expired and Stopped are Ask's and Decided's:
	// the request's round and when the call began waiting; the request;
	// whether its wait expired, or the turn was stopped meanwhile.
	Round    int               `json:"round,omitempty"`
	Began    time.Time         `json:"began,omitzero"`
	Asked    *machine.Asked    `json:"asked,omitempty"`
	Decision *machine.Decision `json:"decision,omitempty"`
	Expired  bool              `json:"expired,omitempty"`
	Stopped  bool              `json:"stopped,omitempty"`
	// Beaten is Call's: the workflow keeps the beat of the call's batch
	// and sends its still_working notices (Notice); the call sends none
	// of its own.
	Beaten bool `json:"beaten,omitempty"`
}

// asked is what Ask returns: the request, and a decision made at once (a
// request the store refused).
type asked struct {
	Asked    machine.Asked     `json:"asked"`
	Decision *machine.Decision `json:"decision,omitempty"`
}

// decided is what Decided returns: whether the call runs, is to be asked
// again, or still waits (no decision in the store yet: a signal of another
// round).
type decided struct {
	Waits bool           `json:"waits,omitempty"`
	Run   bool           `json:"run,omitempty"`
	Again bool           `json:"again,omitempty"`
	Out   machine.Called `json:"out"`
}

// advanced is what Advance returns: the state after its units, and how
// the turn ended if it did.
type advanced struct {
	State machine.State `json:"state"`
	Ended *Outcome      `json:"ended,omitempty"`
}

// Outcome is how a turn ended: the workflow's result. The record and the
// conversation are in the store.
type Outcome struct {
	// TurnID (turn_id) names the turn.
	TurnID string `json:"turn_id"`
	// Status is how the turn ended, and StopReason (stop_reason) why, as
	// its record says.
	Status     budget.Status     `json:"status"`
	StopReason budget.StopReason `json:"stop_reason"`
	// Messages counts the messages the turn added to its session's
	// conversation (the store's payloads hold them).
	Messages int `json:"messages"`
}

// beat is what a unit's heartbeat carries: when the unit began and how
// long it had run, and a tool call's last progress report — what a
// workflow knows of a unit whose worker was lost.
type beat struct {
	CallID string `json:"call_id,omitempty"`
	// Worker names the worker that runs the unit ("pid 4242 on host"):
	// Temporal's timeout of a heartbeat does not, and the call's lost
	// result names it.
	Worker   string    `json:"worker,omitempty"`
	Started  time.Time `json:"started"`
	RanMS    int64     `json:"ran_ms"`
	Progress *float64  `json:"progress,omitempty"`
	Total    *float64  `json:"total,omitempty"`
	Message  string    `json:"message,omitempty"`
	// Attempt is the activity's attempt: a tool that declares retries is
	// run again after its worker was lost. First is when the call's first
	// attempt started, and Reports counts the progress reports of all its
	// attempts so far (Temporal keeps an attempt's last heartbeat for the
	// next).
	Attempt int32     `json:"attempt,omitempty"`
	First   time.Time `json:"first,omitzero"`
	Reports int       `json:"reports,omitempty"`
}

// thisWorker names this process among the workers, for its heartbeats.
var thisWorker = func() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("pid %d on %s", os.Getpid(), cmp.Or(host, "an unnamed host"))
}()

// maxBeatMessage bounds a progress message in a heartbeat: Temporal fails
// the activity whose heartbeat details pass its payload limit.
const maxBeatMessage = 1024

// errEngine marks an activity that did not finish its unit because the
// engine gave it up (Temporal timed it out, or its worker is stopping):
// the workflow takes the unit for lost.
var errEngine = errors.New("the engine gave this unit up")

// errHandOver is what a model step given up by its worker's stop returns:
// its workflow task is to fail, and go to another worker (driver.Run).
var errHandOver = sdktemporal.NewApplicationError("the worker, stopping, handed the turn over", typeHandOver)

// typeHandOver is errHandOver's type.
const typeHandOver = "hand_over"

// Advance runs the turn's units from its state until a batch of tool calls
// or the end (machine.Units.Advance): its model steps and compactions, its
// beginning, its end when a unit decides it.
func (x *activities) Advance(ctx context.Context, in *unitIn) (_ *advanced, err error) {
	s := &in.State
	if !s.Begun && s.Seen == 0 {
		if err := x.store.BeginTurn(ctx, store.TurnStart{TurnID: s.TurnID, SessionID: s.SessionID, Engine: engineOn(activity.GetInfo(ctx).TaskQueue),
			Agent: x.units.Ref().Name, StartedAt: s.Start}); err != nil && !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrSessionBusy) {
			return nil, fmt.Errorf("storing turn %s: %w", s.TurnID, err)
		}
	}
	tr, err := loadTranscript(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	u := x.unit(ctx, s.TurnID, beat{})
	defer u.close()
	defer func() {
		if err != nil && u.handOver.Load() {
			// What failed once the worker's stop gave the unit up (its
			// store closing, say) is the stop's doing: Temporal's SDK
			// would have dropped it, and the step runs again elsewhere.
			err = errHandOver
		}
	}()
	// Given up by the worker's stop as by Temporal's (running.actx).
	ctx = u.actx
	sink := x.sink(u.ctx, u)
	if err := x.catchUp(ctx, s, sink); err != nil {
		return nil, err
	}
	ended := x.units.Advance(u.ctx, s, tr, sink)
	if err := u.engineErr(s.Stop); err != nil {
		return nil, err
	}
	if u.handOver.Load() {
		// What it recorded (the attempt it gave up) reaches the store
		// before the worker's Stop returns, or is recorded lost by the
		// next worker (catchUp), which runs the step again.
		sink.flush(ctx)
		return nil, errHandOver
	}
	out := &advanced{State: *s}
	if ended != nil {
		if out.Ended, err = x.finish(ctx, s, sink, tr, ended); err != nil {
			return nil, err
		}
	} else if err := sink.flush(ctx); err != nil {
		return nil, err
	}
	return out, tr.flush(ctx, doneKey(in.Key), out)
}

// catchUp looks at what was stored for the turn since its last model step
// began (State.Seen) for what a unit lost with its worker left: a
// turn_started (the turn is begun); the model call attempts of the step
// about to be made that began and have no record; and the compactions
// that began and did not finish. Each gets one record (outcome
// interrupted, phase worker_lost), and the step numbers its attempts, and
// its compactions', on after every one that began.
func (x *activities) catchUp(ctx context.Context, s *machine.State, sink *storeSink) error {
	evs, err := x.store.Events(ctx, s.TurnID, s.Seen, 0)
	if err != nil {
		return fmt.Errorf("reading turn %s: %w", s.TurnID, err)
	}
	step := s.Steps + 1
	type compaction struct{ step, attempt int }
	begun := map[int]machine.LostAttempt{}
	current := 0 // the step's attempt streaming: a step's attempts run one after another
	compacting := map[compaction]machine.LostAttempt{}
	var order []compaction
	for _, e := range evs {
		s.Seen = e.Seq
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			s.Begun = true
		case *event.LLMStarted:
			if d.Step == step {
				begun[d.Attempt] = machine.LostAttempt{Attempt: d.Attempt, Model: d.Model, Provider: d.Provider, Profile: d.Profile, Started: e.At,
					Traceparent: d.Traceparent}
				s.Attempts = max(s.Attempts, d.Attempt)
				current = d.Attempt
			}
		case *event.LLMDelta:
			if la, ok := begun[current]; ok && d.Step == step {
				la.Last = e.At
				begun[current] = la
			}
		case *event.LLMFinished:
			if d.Step == step {
				delete(begun, d.Attempt)
			}
		case *event.CompactionStarted:
			// Every compaction the lost unit began, whatever its step: a
			// forced one is of the step after the one it ran.
			c := compaction{d.Step, max(d.Attempt, 1)}
			compacting[c] = machine.LostAttempt{Step: d.Step, Compaction: true, Attempt: c.attempt, EstimatedTokens: d.EstimatedTokens, Started: e.At,
				Traceparent: d.Traceparent}
			order = append(order, c)
			if d.Step == step {
				s.CompactAttempts = max(s.CompactAttempts, c.attempt)
			}
		case *event.CompactionFinished:
			if d.Record != nil {
				delete(compacting, compaction{d.Step, max(d.Record.Attempt, 1)})
			}
		}
	}
	var lost []machine.LostAttempt
	for a := 1; a <= s.Attempts; a++ {
		if la, ok := begun[a]; ok {
			lost = append(lost, la)
		}
	}
	for _, c := range order {
		if la, ok := compacting[c]; ok {
			lost = append(lost, la)
			delete(compacting, c)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	x.units.LostAttempts(s, step, lost, "the worker running it was lost (it died, or stopped answering) before it ended", sink)
	return nil
}

// Call runs one tool call (machine.Units.Call). A call whose result is in
// the store already — a call that ended, whose report was lost — is not
// run again.
func (x *activities) Call(ctx context.Context, in *unitIn) (*machine.Called, error) {
	s := &in.State
	callID := machine.CallID(in.Step, in.Call.Index)
	if activity.GetInfo(ctx).Attempt > 1 {
		// A retry (the tool declares retries): a call that ended keeps its
		// result, and is not run again.
		if out, ok, err := doneResult[machine.Called](ctx, x.payloads, s.TurnID, in.Key); ok || err != nil {
			return out, err
		}
	}
	tr, err := loadCall(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	if activity.GetInfo(ctx).Attempt > 1 {
		// A retry (the tool declares retries): a record stored by the
		// attempt before means the call ended; only its report was lost.
		if rec, err := x.record(ctx, s.TurnID, callID); err != nil || rec != nil {
			if err != nil {
				return nil, err
			}
			x.units.Lost(s, in.Step, in.Call, machine.Loss{Recorded: rec}, tr)
			out := &machine.Called{}
			return out, tr.flush(ctx, doneKey(in.Key), out)
		}
	}
	if in.Beaten {
		s.Budgets.ProgressNotice = budget.Duration{}
	}
	b := beat{CallID: callID}
	if info := activity.GetInfo(ctx); info.Attempt > 1 {
		// Run again after its worker was lost: what the attempts before
		// did, as their last heartbeat said, goes on in this one's and
		// into the call's record.
		var prev beat
		if activity.HasHeartbeatDetails(ctx) && activity.GetHeartbeatDetails(ctx, &prev) == nil && prev.CallID == callID {
			b.First, b.Reports = cmp.Or(prev.First, prev.Started), prev.Reports
		}
		b.Attempt = info.Attempt
		in.Call.Earlier = &machine.Earlier{Runs: int(info.Attempt) - 1, First: b.First, Reports: b.Reports}
	}
	u := x.unit(ctx, s.TurnID, b)
	defer u.close()
	sink := x.sink(u.ctx, u)
	out := x.units.Call(u.ctx, s, in.Step, in.Call, tr, sink)
	if err := u.engineErr(out.Cause); err != nil {
		return nil, err
	}
	if err := sink.flush(ctx); err != nil {
		return nil, err
	}
	return &out, tr.flush(ctx, doneKey(in.Key), &out)
}

// Notice sends the still_working of a beat of the batch of step in.Step
// (machine.Units.StillWorking): its calls that run, as the store's events
// say — tool_started and no tool_finished, their last tool_progress — one
// notice naming those that were silent, none when none was.
func (x *activities) Notice(ctx context.Context, in *unitIn) error {
	s := &in.State
	evs, err := x.store.Events(ctx, s.TurnID, s.Seen, 0)
	if err != nil {
		return fmt.Errorf("reading turn %s: %w", s.TurnID, err)
	}
	running := map[string]*machine.Running{}
	var order []string
	for _, e := range evs {
		switch d := e.Data.(type) {
		case *event.ToolStarted:
			if d.Step == in.Step {
				running[d.CallID] = &machine.Running{Step: d.Step, CallID: d.CallID, Tool: d.Tool, Started: e.At,
					Limit: time.Duration(d.TimeoutMS) * time.Millisecond}
				order = append(order, d.CallID)
			}
		case *event.ToolProgress:
			if r, ok := running[d.CallID]; ok {
				r.LastReport = e.At
			}
		case *event.ToolFinished:
			delete(running, d.CallID)
		}
	}
	var calls []machine.Running
	for _, id := range order {
		if r, ok := running[id]; ok {
			calls = append(calls, *r)
			delete(running, id) // a call run again started twice
		}
	}
	sink := x.sink(ctx, nil)
	x.units.StillWorking(s, calls, time.Now(), sink)
	return sink.flush(ctx)
}

// Refuse records a call that is not run (machine.Units.Refuse): the
// workflows recorded before RefuseCalls refused each call alone, and
// replay so.
func (x *activities) Refuse(ctx context.Context, in *unitIn) (*machine.Called, error) {
	out, err := x.refuse(ctx, &in.State, in.Step, []machine.Call{in.Call}, in.Reason)
	if err != nil {
		return nil, err
	}
	return &out[0], nil
}

// RefuseCalls records calls of one batch that are not run
// (machine.Units.Refuse): up to refuseShare of them, in one transaction
// of their messages, their records queued and committed in groups.
func (x *activities) RefuseCalls(ctx context.Context, in *unitIn) ([]machine.Called, error) {
	return x.refuse(ctx, &in.State, in.Step, in.Calls, in.Reason)
}

// refuse records calls cs of step's batch as not run. A call refused
// before — the local activity asked again — keeps its record, and the
// model is told what it says.
func (x *activities) refuse(ctx context.Context, s *machine.State, step int, cs []machine.Call, reason string) ([]machine.Called, error) {
	tr, err := loadCall(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	recs, err := x.records(ctx, s.TurnID)
	if err != nil {
		return nil, err
	}
	out := make([]machine.Called, len(cs))
	var fresh []machine.Call
	var at []int
	for i, c := range cs {
		if rec, ok := recs[machine.CallID(step, c.Index)]; ok {
			x.units.Lost(s, step, c, machine.Loss{Recorded: &rec}, tr)
			continue
		}
		fresh, at = append(fresh, c), append(at, i)
	}
	if len(fresh) > 0 {
		sink := x.sink(ctx, nil)
		for j, o := range x.units.Refuse(s, step, fresh, reason, tr, sink) {
			out[at[j]] = o
		}
		if err := sink.flush(ctx); err != nil {
			return nil, err
		}
	}
	return out, tr.flush(ctx, "", nil)
}

// Lost records a call whose activity failed — its worker died or stopped
// answering, or Temporal gave it up — unless its record reached the store
// (machine.Units.Lost): what it is known to have run, from its last
// heartbeat or else its tool_started, apart from when the loss was noticed.
func (x *activities) Lost(ctx context.Context, in *unitIn) (*machine.Called, error) {
	s := &in.State
	callID := machine.CallID(in.Step, in.Call.Index)
	l := machine.Loss{Why: in.Why, Noticed: in.Noticed}
	tr, rec, err := x.recorded(ctx, in)
	if err != nil {
		return nil, err
	}
	l.Recorded = rec
	if l.Recorded == nil {
		// When it started, unless its heartbeat says, and the ids of the
		// span its worker began, for the span made of the loss.
		if l.Started, l.Traceparent, err = x.toolStarted(ctx, s.TurnID, callID); err != nil {
			return nil, err
		}
	}
	if b := in.Beat; b != nil && b.CallID == callID {
		l.Started, l.Ran = b.Started, time.Duration(b.RanMS)*time.Millisecond
		l.Runs, l.First, l.Reports = int(b.Attempt), cmp.Or(b.First, b.Started), b.Reports
	}
	sink := x.sink(ctx, nil)
	out := x.units.Lost(s, in.Step, in.Call, l, tr, sink)
	if err := sink.flush(ctx); err != nil {
		// The call's own record may have come first: asked again (a local
		// activity's retry), it is used.
		return nil, err
	}
	return &out, tr.flush(ctx, "", nil)
}

// Ask has a call ask for a person's decision, when its tool needs one
// (machine.Units.Ask): the request is stored before approval_requested.
func (x *activities) Ask(ctx context.Context, in *unitIn) (*asked, error) {
	ap, ok := x.store.(store.Approvals)
	if !ok {
		return nil, errors.New("the store keeps no approvals")
	}
	s := &in.State
	// Asked again (its worker died, or its report to Temporal was lost,
	// once the request was stored): the person was asked, and is not
	// asked twice; the request stored is the call's wait.
	callID := machine.CallID(in.Step, in.Call.Index)
	if got, err := ap.Approval(ctx, s.TurnID, callID); err == nil && got.Round == max(in.Round, 1) {
		began := in.Began
		if began.IsZero() {
			began = got.RequestedAt
		}
		return &asked{Asked: machine.Asked{Needed: true, CallID: callID, Tool: got.Tool, Arguments: got.Arguments, Round: got.Round,
			RequestedAt: got.RequestedAt, ExpiresAt: got.ExpiresAt, Began: began}}, nil
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	tr, err := loadCall(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	record := func(ctx context.Context, a machine.Asked) error {
		return ap.RequestApproval(ctx, store.Approval{TurnID: s.TurnID, CallID: a.CallID, Round: a.Round, Tool: a.Tool,
			Arguments: a.Arguments, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt})
	}
	sink := x.sink(ctx, nil)
	a, d := x.units.Ask(ctx, s, in.Step, in.Call, in.Round, in.Began, record, tr, sink)
	if err := sink.flush(ctx); err != nil {
		return nil, err
	}
	return &asked{Asked: a, Decision: d}, tr.flush(ctx, "", nil)
}

// Decided ends a call's wait for a person (machine.Units.Decided) with
// the decision the store holds — the expiry, when the wait expired and no
// decision came first — or says it still waits.
func (x *activities) Decided(ctx context.Context, in *unitIn) (*decided, error) {
	ap, ok := x.store.(store.Approvals)
	if !ok {
		return nil, errors.New("the store keeps no approvals")
	}
	s := &in.State
	a := *in.Asked
	d := in.Decision
	switch {
	case d != nil:
	case in.Stopped:
		d = &machine.Decision{Stopped: true}
	case in.Expired:
		got, err := approve.Expire(ctx, ap, s.TurnID, a.CallID, a.ExpiresAt)
		if err != nil {
			return nil, err
		}
		d = &machine.Decision{Decision: got.Decision, By: got.By, Reason: got.Reason, At: got.At}
	default:
		got, ok, err := approve.Decided(ctx, ap, s.TurnID, a.CallID, a.Round)
		if err != nil {
			return nil, err
		}
		if !ok {
			return &decided{Waits: true}, nil
		}
		d = &machine.Decision{Decision: got.Decision, By: got.By, Reason: got.Reason, At: got.At}
	}
	tr, err := loadCall(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	sink := x.sink(ctx, nil)
	run, again, out := x.units.Decided(s, in.Step, in.Call, a, *d, tr, sink)
	if err := sink.flush(ctx); err != nil {
		return nil, err
	}
	return &decided{Run: run, Again: again, Out: out}, tr.flush(ctx, "", nil)
}

// End ends a turn stopped between units of work (machine.Units.End).
func (x *activities) End(ctx context.Context, in *unitIn) (*Outcome, error) {
	s := &in.State
	if o, err := x.ended(ctx, s); o != nil || err != nil {
		return o, err
	}
	tr, err := loadTranscript(ctx, x.payloads, s)
	if err != nil {
		return nil, err
	}
	sink := x.sink(ctx, nil)
	ended := x.units.End(s, *in.End, tr, sink)
	return x.finish(ctx, s, sink, tr, ended)
}

// ended returns the outcome of a turn the store has ended already: by
// another unit whose report was lost, or by a gateway that took its engine
// for lost.
func (x *activities) ended(ctx context.Context, s *machine.State) (*Outcome, error) {
	rec, err := x.store.Turn(ctx, s.TurnID)
	if err != nil || rec.Status == budget.StatusRunning {
		return nil, err
	}
	return &Outcome{TurnID: rec.TurnID, Status: rec.Status, StopReason: rec.StopReason, Messages: s.Messages}, nil
}

// finish stores an ended turn of state s: its conversation, then its
// record, and makes the turn's span once the record is stored (not for a
// turn another stored the end of). Its runner, which began the span, may
// be gone, or no longer follow the turn: it leaves the span to this
// worker when the store says the worker makes it (keyTurnSpan, written
// before the end). From that note on, the worker's stop neither cancels
// the end's write (a commit cut by it may have been stored, and the span
// would then be made by no one) nor returns before the span is ended
// (relaying.Stop).
func (x *activities) finish(ctx context.Context, s *machine.State, sink *storeSink, tr *transcript, ended *machine.Ended) (*Outcome, error) {
	if err := sink.flush(ctx); err != nil {
		if errors.Is(err, store.ErrNotRunning) {
			return x.ended(ctx, &machine.State{TurnID: ended.Record.TurnID, Messages: len(ended.Messages)})
		}
		return nil, err
	}
	rec := ended.Record
	o := &Outcome{TurnID: rec.TurnID, Status: rec.Status, StopReason: rec.StopReason, Messages: len(ended.Messages)}
	if err := tr.flush(ctx, "", nil); err != nil {
		return nil, err
	}
	// The sink stored every event of the turn, numbered by the store, and
	// each unit its calls' records with their events; the record's calls
	// are those, read without their results (transcript.Records). The end
	// leaves all of them as they are stored (store.EndOf): the events were
	// read back whole here, every result again, only to be found stored,
	// and the calls were written again (issue 29).
	rec.Events, rec.ToolCalls, rec.ModelCalls = nil, nil, nil
	span := x.units.TurnSpan(s)
	endCtx := ctx
	if span != nil {
		x.spans.begin()
		defer x.spans.end()
		if err := x.payloads.PutPayloads(ctx, rec.TurnID, map[string][]byte{keyTurnSpan: []byte("worker")}); err != nil {
			return nil, err
		}
		var cancel context.CancelFunc
		endCtx, cancel = uncancelled(ctx)
		defer cancel()
	}
	switch err := x.store.FinishTurn(endCtx, rec, ended.Messages); {
	case err == nil:
		if span != nil {
			span(rec)
		}
	case !errors.Is(err, store.ErrNotRunning):
		return nil, fmt.Errorf("storing the record of turn %s: %w", rec.TurnID, err)
	}
	return o, nil
}

// uncancelled returns ctx without its cancellation, keeping its deadline
// and values.
func uncancelled(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

// Recover returns the result a unit stored (under in.Key) before its
// report to Temporal was lost, if it did: the workflow then goes on from
// it rather than take the unit for lost.
func (x *activities) Recover(ctx context.Context, in *unitIn) (*recovered, error) {
	var b []byte
	err := x.payloads.Payload(ctx, in.State.TurnID, doneKey(in.Key), func(data []byte) error { b = bytes.Clone(data); return nil })
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &recovered{}, nil
	case err != nil:
		return nil, err
	}
	return &recovered{Found: true, Result: b}, nil
}

// recovered is what Recover found.
type recovered struct {
	Found  bool            `json:"found"`
	Result json.RawMessage `json:"result,omitempty"`
}

// doneResult returns the result a unit stored under key, if it did.
func doneResult[T any](ctx context.Context, p store.Payloads, turnID, key string) (*T, bool, error) {
	if key == "" {
		return nil, false, nil
	}
	var out T
	switch err := p.Payload(ctx, turnID, doneKey(key), func(data []byte) error { return json.Unmarshal(data, &out) }); {
	case errors.Is(err, store.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return &out, true, nil
}

// recorded reads what a call's unit needs — the step's assistant message —
// and the call's stored record, nil if it has none.
func (x *activities) recorded(ctx context.Context, in *unitIn) (*transcript, *event.ToolCall, error) {
	tr, err := loadCall(ctx, x.payloads, &in.State)
	if err != nil {
		return nil, nil, err
	}
	rec, err := x.record(ctx, in.State.TurnID, machine.CallID(in.Step, in.Call.Index))
	return tr, rec, err
}

// record returns the stored record of a call, nil if there is none.
func (x *activities) record(ctx context.Context, turnID, callID string) (*event.ToolCall, error) {
	recs, err := x.records(ctx, turnID)
	if rec, ok := recs[callID]; ok {
		return &rec, nil
	}
	return nil, err
}

// records returns the stored records of a turn's calls, by call id.
func (x *activities) records(ctx context.Context, turnID string) (map[string]event.ToolCall, error) {
	rec, err := x.store.Turn(ctx, turnID)
	if err != nil {
		return nil, fmt.Errorf("reading turn %s: %w", turnID, err)
	}
	out := make(map[string]event.ToolCall, len(rec.ToolCalls))
	for _, tc := range rec.ToolCalls {
		out[tc.CallID] = tc
	}
	return out, nil
}

// toolStarted returns when a call's tool_started was emitted, zero if it
// was not, and the traceparent it named (its last, for a call run again).
func (x *activities) toolStarted(ctx context.Context, turnID, callID string) (at time.Time, traceparent string, err error) {
	evs, err := x.store.Events(ctx, turnID, 0, 0)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("reading turn %s: %w", turnID, err)
	}
	for _, e := range evs {
		if d, ok := e.Data.(*event.ToolStarted); ok && d.CallID == callID {
			if at.IsZero() {
				at = e.At
			}
			traceparent = d.Traceparent // the last run's, for a call run again (retries)
		}
	}
	return at, traceparent, nil
}

func doneKey(key string) string {
	if key == "" {
		return ""
	}
	return keyDone + key
}

// running is a unit under way on this worker: what it runs beside it.
type running struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	beat   atomic.Pointer[beat]
	// reports counts a call's progress reports in this attempt
	// (storeSink.Reported), for its heartbeats.
	reports    atomic.Int64
	quit       chan struct{}
	wg         sync.WaitGroup
	unwatch    func()
	stopEngine func() bool
	// ended counts the unit out of its worker's units under way.
	ended func()
	// engine is set when the engine gave the unit up; by says who
	// (engineWhy).
	engine atomic.Bool
	by     atomic.Pointer[string]
	// endedOutside is set when another ended the turn in the store while
	// the unit ran (a gateway that took the engine for lost, a cancel no
	// worker took): the end recorded the unit's calls, and made their
	// spans (agent.TraceLost); what the unit says of them now is not the
	// turn's.
	endedOutside atomic.Bool
	// handOver is set when the worker's stop gave a local unit (a model
	// step) up: the unit returns errHandOver.
	handOver atomic.Bool
	// unstop ends the unit's watch on its worker's stop; nil for none.
	unstop func()
	// actx is the activity's context, which the worker's stop cancels
	// too (with worker.ErrWorkerShutdown, as Temporal's SDK does later).
	actx context.Context
}

// unit starts what every long unit of work runs beside it: a heartbeat on a
// fixed cadence, carrying when the unit began and how long it has run (and
// a call's last progress), so that Temporal notices a dead worker within
// the heartbeat timeout and the workflow knows what the lost unit ran; and
// a watch on the store's cancel requests, which reach the unit at once
// rather than at its next heartbeat.
//
// The unit's context is not the activity's: Temporal cancels an
// activity's context when a heartbeat cannot reach it, and an engine that
// is away for a few seconds must not stop a tool (the unit's records reach
// the store meanwhile, and its result waits there). Only a cancellation
// the engine means reaches the unit: the workflow cancelled it, Temporal
// gave the attempt up (its heartbeat timed out), the worker is stopping,
// or the activity's own deadline passed.
func (x *activities) unit(actx context.Context, turnID string, b beat) *running {
	x.under.begin()
	u := &running{quit: make(chan struct{}), ended: x.under.end}
	u.ctx, u.cancel = context.WithCancelCause(context.WithoutCancel(actx))
	b.Started, b.Worker = time.Now(), thisWorker
	u.beat.Store(&b)
	local := activity.IsActivity(actx) && activity.GetInfo(actx).IsLocalActivity
	if x.stopping != nil {
		// The worker's Stop gives the unit up as the SDK would, only
		// sooner: before the SDK's own Stop waits for its workflow tasks.
		var stopped context.CancelCauseFunc
		actx, stopped = context.WithCancelCause(actx)
		unstop := context.AfterFunc(x.stopping, func() { stopped(worker.ErrWorkerShutdown) })
		u.unstop = func() {
			unstop()
			stopped(nil)
		}
	}
	u.actx = actx
	u.stopEngine = context.AfterFunc(actx, func() {
		switch cause := context.Cause(actx); {
		case local && errors.Is(cause, worker.ErrWorkerShutdown):
			// Its worker stopping (a deploy) gives it up; the workflow
			// task goes to another worker, which runs the unit again
			// (errHandOver). Nothing cancelled the turn: its record says
			// who did this.
			u.handOver.Store(true)
			u.cancel(&budget.CancelError{Reason: budget.Cancelled, By: engineWhy(cause)})
		case local && !errors.Is(cause, context.DeadlineExceeded):
			// A local activity has no heartbeats to fail: the workflow
			// cancelled it.
			u.cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the turn's workflow"})
		case sdktemporal.IsCanceledError(cause):
			u.cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the turn's workflow"})
		case isGivenUp(cause):
			by := engineWhy(cause)
			u.by.Store(&by)
			u.engine.Store(true)
			u.cancel(&budget.CancelError{Reason: budget.EngineLost, By: by})
		}
	})
	requested, unwatch := x.store.WatchCancel(turnID)
	u.unwatch = unwatch
	hctx := context.WithoutCancel(actx)
	if activity.IsActivity(actx) && !local {
		// At once: a worker that dies before its first tick leaves its
		// name and the call's start with Temporal all the same.
		activity.RecordHeartbeat(hctx, u.beating())
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		// Temporal sends at most one heartbeat per 80% of the timeout;
		// beating more often only keeps the latest details fresh.
		tick := time.NewTicker(x.heartbeat / 3)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				activity.RecordHeartbeat(hctx, u.beating())
			case <-requested:
				requested = nil
				if x.endedOutside(hctx, turnID) {
					u.endedOutside.Store(true)
				}
				u.cancel(x.cancelReason(hctx, turnID))
			case <-u.quit:
				return
			}
		}
	}()
	return u
}

// endedOutside reports whether turn turnID has ended in the store: its
// end, stored by another while a unit of it runs, woke the unit's watch
// of the turn's cancel requests.
func (x *activities) endedOutside(ctx context.Context, turnID string) bool {
	rec, err := x.payloads.TurnWithoutResults(ctx, turnID)
	return err == nil && rec.Status != budget.StatusRunning
}

// cancelReason says why a cancel was requested for the turn: a client, or
// the gone process that followed it for its client (client_gone).
func (x *activities) cancelReason(ctx context.Context, turnID string) *budget.CancelError {
	ce := &budget.CancelError{Reason: budget.Cancelled, By: "a client"}
	if cr, ok := x.store.(store.CancelReasons); ok {
		if why, err := cr.CancelReason(ctx, turnID); err == nil && why != nil {
			if why.By == "" {
				why.By = ce.By
			}
			return why
		}
	}
	return ce
}

// beating returns the unit's heartbeat now.
func (u *running) beating() beat {
	b := *u.beat.Load()
	b.RanMS = time.Since(b.Started).Milliseconds()
	b.Reports += int(u.reports.Load())
	return b
}

// progress keeps a call's progress report for its next heartbeat.
func (u *running) progress(p *event.ToolProgress) {
	b := *u.beat.Load()
	b.Progress, b.Total, b.Message = p.Progress, p.Total, p.Message
	if len(b.Message) > maxBeatMessage {
		b.Message = b.Message[:maxBeatMessage]
	}
	u.beat.Store(&b)
}

// close ends what runs beside the unit; the unit has recorded how it
// ended, and its worker's Stop no longer waits for it.
func (u *running) close() {
	close(u.quit)
	u.wg.Wait()
	u.stopEngine()
	if u.unstop != nil {
		u.unstop()
	}
	u.unwatch()
	u.cancel(nil)
	u.ended()
}

// engineErr returns an error of type "engine" when the engine gave the
// unit up: what the unit met (cause) is then no stop of the turn's, and
// the workflow takes the unit for lost. Its message is who gave it up
// (lostWhy says it to the model and the record).
func (u *running) engineErr(cause *machine.Cause) error {
	if !u.engine.Load() {
		return nil
	}
	msg := errEngine.Error()
	if by := u.by.Load(); by != nil {
		msg = *by
	}
	return sdktemporal.NewApplicationErrorWithCause(msg, "engine", cause.Err())
}

// isGivenUp reports whether a cancellation of an activity's context by
// Temporal's SDK means the unit must stop: Temporal no longer has the
// attempt (its heartbeat timed out meanwhile, or the workflow is gone),
// the worker is stopping, or the activity's own deadline passed. A
// heartbeat that failed because the server was away is none of these.
func isGivenUp(cause error) bool {
	var nf *serviceerror.NotFound
	return errors.As(cause, &nf) || errors.Is(cause, worker.ErrWorkerShutdown) || errors.Is(cause, context.DeadlineExceeded) &&
		!isServiceError(cause)
}

func isServiceError(err error) bool {
	var de *serviceerror.DeadlineExceeded
	var un *serviceerror.Unavailable
	return errors.As(err, &de) || errors.As(err, &un)
}

func engineWhy(cause error) string {
	switch {
	case errors.Is(cause, worker.ErrWorkerShutdown):
		return "the worker, stopping"
	case errors.Is(cause, context.DeadlineExceeded):
		return "Temporal (the unit's time ran out)"
	}
	return "Temporal (it had given the attempt up: " + cause.Error() + ")"
}

func (x *activities) sink(ctx context.Context, u *running) *storeSink {
	return &storeSink{ctx: ctx, s: x.store, log: x.log, unit: u, x: x}
}

// storeSink writes a unit's events to the store, numbered by the store:
// those that carry a call record before the unit goes on, the rest queued
// (store.Recorder). A tool_progress event goes into the unit's next
// heartbeat. Late results of abandoned calls update their stored records.
type storeSink struct {
	ctx  context.Context
	s    store.Store
	log  *slog.Logger
	unit *running
	x    *activities

	mu  sync.Mutex
	err error
}

// Emit implements event.Sink.
func (k *storeSink) Emit(e event.Event) {
	if p, ok := e.Data.(*event.ToolProgress); ok && k.unit != nil {
		k.unit.progress(p)
	}
	if k.unit != nil && k.unit.endedOutside.Load() {
		// Another ended the turn in the store, recording its running
		// calls interrupted: the store takes nothing more of it, as it
		// would have refused this event.
		k.fail(fmt.Errorf("turn %s ended in the store while this unit ran: %w", e.TurnID, store.ErrNotRunning))
		return
	}
	if k.Disowned() {
		// Temporal gave the unit up: what it says now — its call stopped
		// "cancelled" by that — is not the turn's. The workflow takes the
		// unit for lost, records the loss, and runs a tool that declares
		// retries again; a record stored here would stand for it.
		return
	}
	e.Seq = 0
	// A refused call's record is queued like the rest (store.Enqueue):
	// nothing ran, and the unit's flush stores it before the unit ends.
	if store.WaitForStore(e) && !store.Refused(e) || e.Type == event.TypeTurnFinished {
		err := k.s.AppendEvent(context.WithoutCancel(k.ctx), e)
		if k.unit != nil && (errors.Is(err, store.ErrNotRunning) || errors.Is(err, store.ErrExists) && k.x.endedOutside(k.ctx, e.TurnID)) {
			// Another ended the turn before the unit saw it (its watch),
			// recording this call's end: that end makes its span; the
			// spans, told after this sink, leave theirs.
			k.unit.endedOutside.Store(true)
		}
		k.fail(err)
		return
	}
	k.s.QueueEvent(e, k.fail)
}

// Disowned implements event.Disowner: Temporal gave the unit up, or
// another ended the turn in the store while the unit ran, and the events
// it emits now are not stored. Its calls' spans are left to the loss's
// record, or to the end's (agent.TraceLost): a span of theirs ended here
// too would be a second of one id.
func (k *storeSink) Disowned() bool {
	return k.unit != nil && (k.unit.engine.Load() || k.unit.endedOutside.Load())
}

// Reported implements event.ReportSink: the unit's heartbeats count every
// progress report, coalesced into tool_progress events or not.
func (k *storeSink) Reported(string) {
	if k.unit != nil {
		k.unit.reports.Add(1)
	}
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
