package temporal

import (
	"log/slog"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/store"
)

// WorkerOptions describe a worker. Client, Agent and Store are required.
type WorkerOptions struct {
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
// workflow and its activities. Start it with Run or Start.
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
	w := worker.New(o.Client, o.TaskQueue, o.Options)
	register(w, units, o.Store, p, o.Heartbeat, o.Logger)
	return w, nil
}

// registry is what a worker, a test environment and a replayer register
// workflows and activities with.
type registry interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// register registers the turn workflow and its activities with r.
func register(r registry, units machine.Units, st store.Store, p store.Payloads, heartbeat time.Duration, log *slog.Logger) {
	wf := &turnWorkflow{units: units, heartbeat: heartbeat}
	r.RegisterWorkflowWithOptions(wf.run, workflow.RegisterOptions{Name: WorkflowName})
	x := &activities{units: units, store: st, payloads: p, heartbeat: heartbeat, log: log}
	for name, fn := range map[string]any{
		actAdvance: x.Advance, actCall: x.Call, actRefuse: x.Refuse, actRefuses: x.RefuseCalls, actLost: x.Lost, actAsk: x.Ask, actDecided: x.Decided,
		actRecover: x.Recover, actEnd: x.End,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}
