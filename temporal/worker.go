package temporal

import (
	"log/slog"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/store"
)

// WorkerOptions describe a worker. Client, Agent and Store are required.
type WorkerOptions struct {
	Client client.Client
	// TaskQueue is the queue the worker takes turns from; empty is
	// DefaultTaskQueue.
	TaskQueue string
	// Agent runs the turns' units of work. Every worker of a task queue
	// must run the same agent file.
	Agent *agent.Agent
	// Store is the store the turns' events and records go to, shared with
	// the runners.
	Store store.Store
	// Heartbeat is how often a unit of work heartbeats, and how long
	// Temporal waits without one before it takes the unit's worker for
	// dead: a tool call is then recorded as lost (or retried, if its tool
	// declares retries), a model step is run again on another worker.
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
	if o.Store == nil {
		return nil, errNoStore
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
	wf := &turnWorkflow{agent: o.Agent, heartbeat: o.Heartbeat}
	w.RegisterWorkflowWithOptions(wf.run, workflow.RegisterOptions{Name: WorkflowName})
	x := &activities{agent: o.Agent, store: o.Store, heartbeat: o.Heartbeat, log: o.Logger}
	for name, fn := range map[string]any{
		actBegin: x.Begin, actThink: x.Think, actCall: x.Call,
		actRefuse: x.Refuse, actLost: x.Lost, actEnd: x.End,
	} {
		w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	return w, nil
}
