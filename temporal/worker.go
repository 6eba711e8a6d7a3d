package temporal

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/store"
)

// WorkerOptions describe a worker. Client, Agent and Store are required.
type WorkerOptions struct {
	// Client is the Temporal client the worker polls with; it also relays
	// the store's cancel requests to the turns' workflows (RelayCancels).
	Client client.Client
	// TaskQueue is the queue the worker takes turns from; empty is
	// DefaultTaskQueue.
	TaskQueue string
	// Agent runs the turns' units of work. A turn started with another
	// agent (a runner built from another agent file) is refused: it ends
	// at once, failed, with stop reason agent_mismatch, naming both.
	Agent *agent.Agent
	// Store is the store the turns' events, records and conversations go
	// to, shared with the runners: PostgreSQL (store.Payloads).
	Store store.Store
	// Heartbeat is how often a unit of work heartbeats, and how long
	// Temporal waits without one before it takes the unit's worker for
	// dead: a tool call is then recorded as lost (or retried, if its tool
	// declares retries), a model step is asked again on another worker.
	// Zero is DefaultHeartbeat.
	Heartbeat time.Duration
	// Logger receives errors of late writes; nil discards them.
	Logger *slog.Logger
	// Options are the Temporal worker's own options.
	Options worker.Options
}

// NewWorker returns a worker that runs turns for o.Agent: the turn
// workflow and its activities. Start it with Run or Start. Its Stop gives
// the units under way up, as Temporal's does, but waits (up to 10 s in
// all) for them to record how they ended, and for a unit storing its
// turn's end to end the turn's span: close the store and shut tracing
// down after Stop returns. A turn whose model step it gave up goes to
// another worker at once (relaying.Stop); for that, a zero
// o.Options.WorkerStopTimeout is 10 s, and it takes a WorkflowPanicPolicy
// other than FailWorkflow (with FailWorkflow the turn waits 5 s, until
// its workflow task times out).
func NewWorker(o WorkerOptions) (worker.Worker, error) {
	p, _, err := storesOf(o.Store)
	if err != nil {
		return nil, err
	}
	units, ok := machine.UnitsOf(o.Agent)
	if !ok {
		return nil, errNoAgent
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if err := CheckHeartbeat(o.Heartbeat); err != nil {
		return nil, err
	}
	if o.TaskQueue == "" {
		o.TaskQueue = DefaultTaskQueue
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Options.StickyScheduleToStartTimeout == 0 {
		// A turn's workflow task waits this long on its dead worker's
		// sticky queue before another worker takes it: as long as a
		// unit's heartbeat, not the SDK's 5s.
		o.Options.StickyScheduleToStartTimeout = o.Heartbeat
	}
	stopping, handOver := context.WithCancel(context.Background())
	if o.Options.WorkflowPanicPolicy == worker.FailWorkflow {
		// A workflow task fails by a panic (driver.Run), which would fail
		// the turn's workflow: its units are given up by Temporal's Stop
		// alone, and the turn waits for its task to time out.
		handOver = func() {}
	} else if o.Options.WorkerStopTimeout == 0 {
		// Temporal's Stop waits this long for the workflow tasks under
		// way: a turn's, whose model step its Stop gives up (handOver),
		// fails at once and goes to another worker, rather than 5s later
		// when the server would time it out.
		o.Options.WorkerStopTimeout = endWait
	}
	w := worker.New(o.Client, o.TaskQueue, o.Options)
	under, spans := &counted{}, &counted{}
	register(w, units, o.Store, p, o.Heartbeat, o.Logger, under, spans, stopping)
	return &relaying{Worker: w, o: o, units: under, spans: spans, handOver: handOver}, nil
}

// relaying is a worker that passes the store's cancel requests on to the
// turns' workflows while it runs (RelayCancels), and whose Stop returns
// once the units it gave up have recorded how they ended and ended the
// turn spans they said they make.
type relaying struct {
	worker.Worker
	o WorkerOptions
	// units counts the units under way (activities.unit), spans those
	// between their note that they make their turn's span and its end.
	units, spans *counted
	// handOver gives the units under way up (activities.stopping): its
	// Stop calls it once Temporal's has begun.
	handOver context.CancelFunc
	stop     context.CancelFunc
	done     chan struct{}
}

// Start starts the worker, then relays the store's cancel requests to the
// turns' workflows until Stop (RelayCancels).
func (r *relaying) Start() error {
	if err := r.Worker.Start(); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	r.stop, r.done = stop, make(chan struct{})
	go func() {
		defer close(r.done)
		RelayCancels(ctx, r.o.Client, r.o.Store, r.o.Logger)
	}()
	return nil
}

// Run starts the worker and stops it once interruptCh receives.
func (r *relaying) Run(interruptCh <-chan any) error {
	if err := r.Start(); err != nil {
		return err
	}
	<-interruptCh
	r.Stop()
	return nil
}

// Stop ends the relaying of cancel requests, then stops the worker.
// As Temporal's Stop begins (it stops its pollers and tells the server
// first), the units under way are given up (handOver): a model step's ends its local
// activity with errHandOver, whose workflow task then fails at once
// (driver.Run) and goes to another worker — without it, Temporal's Stop
// dropped the step's result, and the server gave the task to another
// worker only when it timed out, 5s after it began (workflowTaskTimeout).
// Temporal's Stop waits for its workflow tasks (WorkerStopTimeout) but
// not for the units it gave up; they are waited for, for at most endWait
// in all, until each has recorded how it ended — a model attempt "cancelled
// by the worker, stopping", a call's tool stopped — and a unit that has
// noted in the store that it makes its turn's span (keyTurnSpan) has
// ended the span. The program closes its store and shuts its tracing down
// after Stop: a record written later would be lost, and the next worker
// would record the attempt lost with a worker that died (worker_lost);
// a span ended later would not be exported, the runner having left the
// turn's to the unit.
func (r *relaying) Stop() {
	if r.stop != nil {
		r.stop()
		<-r.done
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		r.Worker.Stop()
	}()
	r.handOver()
	<-stopped
	deadline := time.Now().Add(endWait)
	if !r.units.wait(endWait) {
		r.o.Logger.Warn("stopped while units of work it gave up were still recording how they ended: another worker may record them lost", "waited", endWait)
	}
	if !r.spans.wait(time.Until(deadline)) {
		r.o.Logger.Warn("stopped while a unit was still storing a turn's end: the turn's span may not be exported", "waited", endWait)
	}
}

// endWait is how long a worker's Stop waits for the units it gave up to
// end, and for the turn spans they said they make: the records and the
// turn's end they store may be retried for longer while the store is
// away.
const endWait = 10 * time.Second

// counted counts the units of a worker between a beginning and an end
// that its Stop waits for (relaying.Stop): a unit under way, until it has
// recorded how it ended (a model attempt given up by the stop, before,
// was recorded after the program had closed its store, or not at all); a
// unit between its note that it makes its turn's span (keyTurnSpan) and
// the span's end, which the runner leaves to it (before, a worker stopped
// just as a unit had stored its turn's end shut its tracing down before
// the unit ended the span, and no one made it: the turn had no
// invoke_agent span, and its calls' spans no parent). It is safe for
// concurrent use.
type counted struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0; nil when no one waits
}

// begin counts a unit in.
func (t *counted) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
}

// end counts it out.
func (t *counted) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n--; t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// wait returns once no unit is counted, or after d; it reports whether
// none was.
func (t *counted) wait(d time.Duration) bool {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return true
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-idle:
		return true
	case <-timer.C:
		return false
	}
}

// registry is what a worker, a test environment and a replayer register
// workflows and activities with.
type registry interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// register registers the turn workflow and its activities with r; under
// and spans count the activities' units for a worker's Stop, and stopping
// ends when the Stop gives them up.
func register(r registry, units machine.Units, st store.Store, p store.Payloads, heartbeat time.Duration, log *slog.Logger, under, spans *counted, stopping context.Context) {
	wf := &turnWorkflow{units: units, heartbeat: heartbeat}
	r.RegisterWorkflowWithOptions(wf.run, workflow.RegisterOptions{Name: WorkflowName})
	x := &activities{units: units, store: st, payloads: p, heartbeat: heartbeat, log: log, under: under, spans: spans, stopping: stopping}
	for name, fn := range map[string]any{
		actAdvance: x.Advance, actCall: x.Call, actRefuse: x.Refuse, actRefuses: x.RefuseCalls, actLost: x.Lost, actAsk: x.Ask, actDecided: x.Decided,
		actRecover: x.Recover, actEnd: x.End, actNotice: x.Notice,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// RelayCancels passes the cancel requests of the turns st's engine runs on
// to their workflows, as SignalCancel with the stored reason, until ctx
// ends. A request stored where no one signals the workflow — a gateway
// that found a turn's caller gone (client_gone), a cancel through a
// gateway that does not run the turn — otherwise reaches only the units
// that run and watch the store: a turn waiting for a person runs none,
// and went on until its wait expired. Each worker runs it; a turn
// signalled twice is cancelled once. It looks when the store says a
// request was stored, and every relayEvery besides (a notification may be
// lost).
func RelayCancels(ctx context.Context, c client.Client, st store.Store, log *slog.Logger) {
	feed, ok := st.(store.EngineCancels)
	if !ok {
		return
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reasons, _ := st.(store.CancelReasons)
	wake, stop := feed.WatchCancels()
	defer stop()
	t := time.NewTicker(relayEvery)
	defer t.Stop()
	signalled := map[string]bool{}
	for {
		ids, err := feed.EngineCancels(ctx)
		if err == nil {
			pending := make(map[string]bool, len(ids))
			for _, id := range ids {
				pending[id] = true
				if signalled[id] {
					continue
				}
				ce := &budget.CancelError{Reason: budget.Cancelled, By: "a client"}
				if reasons != nil {
					if r, err := reasons.CancelReason(ctx, id); err == nil && r != nil {
						ce = r
					}
				}
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := c.SignalWorkflow(sctx, WorkflowID(id), "", SignalCancel, ce)
				cancel()
				if err == nil {
					signalled[id] = true
					log.Info("cancel request passed on to its turn's workflow", "turn_id", id, "reason", ce.Reason)
				}
			}
			for id := range signalled {
				if !pending[id] {
					delete(signalled, id) // ended: forgotten
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
	}
}

// relayEvery is how often RelayCancels looks without being told.
const relayEvery = 5 * time.Second

// QuietHandOvers wraps h, the handler of Temporal's SDK logger
// (sdklog.NewStructuredLogger): the SDK's "Workflow panic" line, at error
// level with a stack trace, of a workflow task that a stopping worker
// failed on purpose to hand its turn over to another worker (errHandOver)
// becomes a line at info level that says so, with the workflow's ids. Any
// other line passes as it is.
func QuietHandOvers(h slog.Handler) slog.Handler { return quietHandOvers{h} }

// quietHandOvers is QuietHandOvers' handler.
type quietHandOvers struct{ slog.Handler }

func (q quietHandOvers) Enabled(ctx context.Context, l slog.Level) bool {
	// The SDK asks at error level for a line that may become info.
	return q.Handler.Enabled(ctx, l) || l == slog.LevelError
}

func (q quietHandOvers) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "Workflow panic" {
		handOver := false
		var keep []slog.Attr
		r.Attrs(func(a slog.Attr) bool {
			switch {
			case strings.Contains(a.Value.String(), errHandOver.Error()):
				handOver = true
			case a.Key == "WorkflowID" || a.Key == "RunID" || a.Key == "Attempt":
				keep = append(keep, a)
			}
			return true
		})
		if handOver {
			if !q.Handler.Enabled(ctx, slog.LevelInfo) {
				return nil
			}
			n := slog.NewRecord(r.Time, slog.LevelInfo, "the worker, stopping, failed a turn's workflow task: another worker takes the turn on at once", r.PC)
			n.AddAttrs(keep...)
			return q.Handler.Handle(ctx, n)
		}
	}
	if !q.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return q.Handler.Handle(ctx, r)
}

func (q quietHandOvers) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandOvers{q.Handler.WithAttrs(as)}
}

func (q quietHandOvers) WithGroup(name string) slog.Handler {
	return quietHandOvers{q.Handler.WithGroup(name)}
}
