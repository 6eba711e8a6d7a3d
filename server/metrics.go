package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/tool"
)

// metrics are the server's Prometheus metrics (docs/decisions/server-metrics.md
// lists them). They are fed from the turns' events, so they count exactly
// what the records say.
type metrics struct {
	toolDuration   *prometheus.HistogramVec
	timeouts       *prometheus.CounterVec
	overruns       *prometheus.CounterVec
	turns          *prometheus.CounterVec
	failovers      *prometheus.CounterVec
	delivered      prometheus.Counter
	deliveryDelay  prometheus.Histogram
	storeErrors    *prometheus.CounterVec
	turnsRunning   prometheus.GaugeFunc
	abandonedCalls prometheus.GaugeFunc
	reaped         prometheus.CounterFunc
	unkilled       prometheus.GaugeFunc
	escaped        prometheus.CounterFunc
	approvals      *prometheus.CounterVec
	approvalWait   prometheus.Histogram
	webhooks       *prometheus.CounterVec
	mcpRestarts    prometheus.CounterFunc
}

// unknownToolLabel is the tool label of the calls of tools the agent does
// not have.
const unknownToolLabel = "(unknown)"

func newMetrics(reg *prometheus.Registry, running func() float64) (*metrics, error) {
	m := &metrics{
		toolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "timebox_tool_call_duration_seconds",
			Help: "Wall-clock duration of tool calls, by tool (\"(unknown)\" for a name the agent has no tool by) and outcome (ok, error, timed_out, cancelled, abandoned, interrupted, denied, approval_expired).",
			// From a fast lookup to the largest tool_max.
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, []string{"tool", "outcome"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_timeouts_total",
			Help: "Budgets that fired, by phase (tool, tool_idle, llm_first_chunk, llm_idle, llm_budget, step, turn, compaction).",
		}, []string{"phase"}),
		overruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_tool_overruns_total",
			Help: "Advisory tool calls that ran past their budget (their result was used), by tool.",
		}, []string{"tool"}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_turns_total",
			Help: "Turns that ended, by status and stop_reason.",
		}, []string{"status", "stop_reason"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_failovers_total",
			Help: "Model call attempts that failed over to the next credential or model, by the phase that failed.",
		}, []string{"phase"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "timebox_events_delivered_total",
			Help: "Events written to SSE clients, replays included.",
		}),
		deliveryDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "timebox_event_delivery_seconds",
			Help:    "From an event's emission to its write to a live SSE client (store write included; replays excluded).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_store_errors_total",
			Help: "Failed writes to the store, by operation. Each is also logged.",
		}, []string{"op"}),
		turnsRunning: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "timebox_turns_running",
			Help: "Turns running now in this server.",
		}, running),
		abandonedCalls: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "timebox_abandoned_calls_running",
			Help: "Abandoned cooperative tool calls whose code is still running in this process (tool.AbandonedRunning).",
		}, func() float64 { return float64(tool.AbandonedRunning()) }),
		reaped: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "timebox_orphan_processes_reaped_total",
			Help: "Tool processes left running by a timebox process that died (SIGKILL, crash), killed by this process at its start (proctree.ReapOrphans).",
		}, func() float64 { return float64(proctree.ReapedTotal()) }),
		unkilled: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "timebox_unkilled_processes",
			Help: "Processes of stopped tool calls that were sent SIGKILL and have not exited 5s later (uninterruptible sleep), counted until they exit.",
		}, func() float64 { return float64(proctree.UnkilledRunning()) }),
		escaped: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "timebox_escaped_processes_total",
			Help: "Tool processes found outside their call's cgroup (a privileged process moved itself out) by their call's marker, and stopped with the call (proctree.EscapedTotal).",
		}, func() float64 { return float64(proctree.EscapedTotal()) }),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_approvals_total",
			Help: "Decisions on tool calls that waited for a person, by decision (approve, deny, expired).",
		}, []string{"decision"}),
		approvalWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "timebox_approval_wait_seconds",
			Help: "How long tool calls waited for a person's decision (timeouts.approval; not counted by the turn's ceiling).",
			// From a click on the page to a weekend.
			Buckets: []float64{1, 5, 15, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 3 * 24 * 3600, 7 * 24 * 3600},
		}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "timebox_webhook_deliveries_total",
			Help: "Webhook delivery attempts by outcome: delivered (2xx), retry (failed, due again later), failed (given up); not_stored counts deliveries the store refused.",
		}, []string{"outcome"}),
		mcpRestarts: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "timebox_mcp_ignored_cancel_restarts_total",
			Help: "Stdio MCP servers killed and restarted because they had not answered a cancelled call within its kill grace (mcp.on_ignored_cancel: restart; tool.ServerRestarts).",
		}, func() float64 { return float64(tool.ServerRestarts()) }),
	}
	for _, c := range []prometheus.Collector{m.toolDuration, m.timeouts, m.overruns, m.turns, m.failovers,
		m.delivered, m.deliveryDelay, m.storeErrors, m.turnsRunning, m.abandonedCalls, m.reaped, m.unkilled, m.escaped,
		m.approvals, m.approvalWait, m.webhooks, m.mcpRestarts} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// defaultRegistry is a fresh registry with the Go runtime and process
// collectors, for a server whose Config names none.
func defaultRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// observe counts what one event says. Each budget is counted once, where it
// fired: a tool's own budget at tool_finished, a model stream's at
// llm_finished, the turn-level ones (step, turn, llm_budget) at
// turn_finished.
func (m *metrics) observe(e event.Event) {
	switch d := e.Data.(type) {
	case *event.ToolFinished:
		tool := d.Tool
		if d.Refused == event.RefusedUnknownTool {
			// The model's own text: one series for all, not a series for
			// each name a prompt can make it write.
			tool = unknownToolLabel
		}
		m.toolDuration.WithLabelValues(tool, string(d.Outcome)).Observe(float64(d.DurationMS) / 1000)
		if (d.Outcome == event.OutcomeTimedOut || d.Outcome == event.OutcomeAbandoned) &&
			(d.Phase == budget.PhaseTool || d.Phase == budget.PhaseToolIdle) {
			m.timeouts.WithLabelValues(string(d.Phase)).Inc()
		}
		if d.Overran {
			m.overruns.WithLabelValues(d.Tool).Inc()
		}
	case *event.LLMFinished:
		if d.Outcome == event.OutcomeTimedOut && (d.Phase == budget.PhaseLLMFirstChunk || d.Phase == budget.PhaseLLMIdle) {
			m.timeouts.WithLabelValues(string(d.Phase)).Inc()
		}
	case *event.CompactionFinished:
		if d.Outcome == event.OutcomeTimedOut {
			m.timeouts.WithLabelValues(string(budget.PhaseCompaction)).Inc()
		}
	case *event.Failover:
		m.failovers.WithLabelValues(string(d.Phase)).Inc()
	case *event.ApprovalDecided:
		if !d.Stale {
			m.approvals.WithLabelValues(string(d.Decision)).Inc()
			m.approvalWait.Observe(float64(d.WaitedMS) / 1000)
		}
	case *event.TurnFinished:
		m.turns.WithLabelValues(string(d.Status), string(d.StopReason)).Inc()
		switch d.StopReason {
		case budget.TurnTimeout:
			m.timeouts.WithLabelValues(string(budget.PhaseTurn)).Inc()
		case budget.NoProgress:
			m.timeouts.WithLabelValues(string(budget.PhaseStep)).Inc()
		case budget.LLMBudgetExhausted:
			m.timeouts.WithLabelValues(string(budget.PhaseLLMBudget)).Inc()
		}
	}
}

// sent counts one event written to an SSE client; live is false for a
// replayed one, whose age says nothing about delivery.
func (m *metrics) sent(at time.Time, live bool) {
	m.delivered.Inc()
	if live {
		m.deliveryDelay.Observe(time.Since(at).Seconds())
	}
}
