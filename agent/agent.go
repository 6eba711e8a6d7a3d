// Package agent runs agent turns: call the model, run the tool calls it asks
// for under their budgets, feed the results back, until the model answers or
// a turn-level budget stops the turn with a reason and a message written for
// the person waiting (spec §1–§7).
//
// The package imports no provider SDK and no database: models, tools and
// sinks come in through the model, tool and event seams.
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/ids"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// Agent is a configured agent: its model chain, tools and budgets. Build it
// with New. An Agent is immutable and safe for concurrent Run calls.
type Agent struct {
	name         string
	instructions string
	models       []model.Endpoint
	tools        map[string]*entry
	order        []string
	budgets      budget.Budgets
	limits       budget.Limits
	compactAt    int
	compactKnob  budget.Count
	timeNotes    bool
	requestMax   map[string]int64
	origin       string
	fingerprint  string
	// tracer makes the turn's spans; nil when the agent is not traced.
	tracer trace.Tracer
}

// Tool is a tool with its resolved budget.
type Tool struct {
	// Tool is the tool itself: tool.Typed or tool.NewFunc for a Go
	// function, or an exec or MCP tool. It must not be nil.
	Tool tool.Tool
	// Budget is the budget of each of its calls. A zero field takes the
	// agent's: Timeout timeouts.tool (Config.Budgets.Tool), Enforcement
	// the tool kind's default (cooperative for a Go function, hard for
	// exec and MCP tools), KillGrace timeouts.kill_grace; IdleTimeout zero
	// is off. A value without a Source has source "code". New refuses a
	// negative duration, a Timeout of 0 given a Source (every call needs a
	// limit: keep one and use budget.Advisory never to interrupt the
	// tool), an Enforcement that is not one of the three, and a Timeout
	// over timeouts.tool_max.
	Budget budget.ToolBudget
	// Retries is how many more times an engine that runs calls on other
	// machines (package temporal) may run a call of the tool whose worker
	// was lost; 0 (the default) reports the call as lost instead. Only for
	// tools whose calls are safe to run twice. The embedded engine never
	// retries a call.
	Retries int
	// NeedsApproval, when set, decides from a call's arguments whether it
	// waits for a person's decision before it runs (ApprovalRequired: every
	// call). The call waits without a slot of parallel_tools, the tool's
	// timeout starts when it runs, and the turn's ceiling stops while the
	// turn waits for nothing but people.
	NeedsApproval func(arguments json.RawMessage) bool
	// ApprovalTimeout is how long a call waits for the decision before it
	// expires, not run; unset follows timeouts.approval.
	ApprovalTimeout budget.Duration
}

type entry struct {
	Tool
	spec   tool.Spec
	schema *tool.Schema
}

// Config describes an agent. Unset budgets (budget.Duration.Unset) and
// limits that are not positive take the spec's defaults (budget.Knobs);
// to turn off a budget the spec allows to be off, give it a source and no
// value: budget.Duration{Source: budget.SourceCode}.
type Config struct {
	// Name names the agent in records.
	Name string
	// Instructions is the system prompt.
	Instructions string
	// Models is the failover chain: the primary model with each of its
	// credentials in order, then each fallback likewise. At least one.
	Models []model.Endpoint
	// Tools are the tools the model may call. Names must be unique and
	// match ^[a-zA-Z0-9_-]{1,64}$.
	Tools []Tool
	// Budgets and Limits are the turn's budgets.
	Budgets budget.Budgets
	Limits  budget.Limits
	// CompactAt is the estimated prompt size in tokens above which older
	// history is summarised; 0 is off.
	CompactAt int
	// CompactAtSource and CompactAtKnob say where CompactAt came from, for
	// the stop banner of compaction_failed; empty is "code" and
	// context.compact_at.
	CompactAtSource budget.Source
	CompactAtKnob   string
	// TimeNotes tells the model its time (context.time_notes): each tool's
	// budget in its description, the turn's time and tool calls left in
	// each request, each result's duration against its budget. False, the
	// zero value, sends none of it; the agent file's default is on.
	TimeNotes bool
	// RequestMax is the ceiling up to which one turn's Input.Budgets may
	// raise a budget, by knob name ("turn": 2h in nanoseconds, "max_steps":
	// 50): server.request_max in the agent file. A budget it does not name
	// may only be lowered.
	RequestMax map[string]int64
	// Origin says where the agent was defined, for messages: its agent
	// file's path. An engine whose runner and workers were built from
	// different agents names both by it.
	Origin string
	// TracerProvider, when set, traces every turn: spans in OpenTelemetry's
	// GenAI conventions with the budgets they ran under
	// (docs/observability.md). Nil traces nothing and costs nothing. A
	// provider of your own makes the span of a turn another process began
	// (a Temporal worker ending a turn, a store marking a dead process's
	// turn interrupted) only if its ID generator gives the ids asked for:
	// sdktrace.WithIDGenerator(telemetry.IDs{}); telemetry.FromEnv's does.
	TracerProvider trace.TracerProvider
}

// New checks cfg and returns the agent. It returns an error for a missing
// model, a duplicate or invalid tool name, or an input schema that does not
// compile.
func New(cfg Config) (*Agent, error) {
	if len(cfg.Models) == 0 {
		return nil, fmt.Errorf("agent: no model: give at least one model.Endpoint")
	}
	for i, m := range cfg.Models {
		if m.Provider == nil {
			return nil, fmt.Errorf("agent: model %d (%s) has no provider", i, m.Name())
		}
	}
	a := &Agent{
		name:         cfg.Name,
		instructions: cfg.Instructions,
		models:       append([]model.Endpoint(nil), cfg.Models...),
		tools:        map[string]*entry{},
		compactAt:    cfg.CompactAt,
		compactKnob:  budget.Count{N: int64(cfg.CompactAt), Source: cfg.CompactAtSource, Knob: cfg.CompactAtKnob},
		timeNotes:    cfg.TimeNotes,
		requestMax:   maps.Clone(cfg.RequestMax),
		origin:       cfg.Origin,
	}
	if cfg.TracerProvider != nil {
		a.tracer = cfg.TracerProvider.Tracer(instrumentation)
	}
	a.budgets, a.limits = withDefaults(cfg.Budgets, cfg.Limits)
	for _, k := range budget.Knobs {
		// What config.Load refuses in a file, a Go caller may not set
		// either: a turn of 0 with a source stopped every turn at once.
		n := int64(0)
		if d := k.Duration(&a.budgets); d != nil {
			n = int64(d.D)
		} else {
			n = k.Count(&a.limits).N
		}
		if p := k.Check(n); p != "" {
			return nil, fmt.Errorf("agent: %s", p)
		}
	}
	if a.compactKnob.Source == "" {
		a.compactKnob.Source = budget.SourceCode
	}
	if a.compactKnob.Knob == "" {
		a.compactKnob.Knob = "context.compact_at"
	}
	for _, t := range cfg.Tools {
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		spec := t.Tool.Spec()
		if _, dup := a.tools[spec.Name]; dup {
			return nil, fmt.Errorf("agent: two tools are named %q", spec.Name)
		}
		s, err := tool.CompileSchema(spec.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("agent: tool %s: %w", spec.Name, err)
		}
		e := &entry{Tool: t, spec: spec, schema: s}
		e.Budget = a.toolBudget(t.Tool, t.Budget)
		if m := a.budgets.ToolMax; m.D > 0 && e.Budget.Timeout.D > m.D {
			// tool_max bounds every tool's timeout, a Go tool's given in
			// code as much as one from the agent file (spec §2).
			return nil, fmt.Errorf("agent: tool %s: timeout %v (%s) exceeds %s (%v); lower it or raise %s",
				spec.Name, e.Budget.Timeout.D, e.Budget.Timeout.Knob, m.Knob, m.D, m.Knob)
		}
		a.tools[spec.Name] = e
		a.order = append(a.order, spec.Name)
	}
	a.fingerprint = fingerprint(a)
	return a, nil
}

// Check returns an error when t cannot be a tool: it has no Tool, a name
// providers refuse, no way to run (tool.Checker), or a budget the agent
// file would refuse (see Budget). New checks each of its tools with it,
// and so does mcpserve.New; what concerns the tools together (unique
// names, timeouts.tool_max) is theirs.
func (t Tool) Check() error {
	if t.Tool == nil {
		return errors.New("a tool entry has no Tool (give it one, such as tool.Typed(name, description, func))")
	}
	spec := t.Tool.Spec()
	if !tool.NameRE.MatchString(spec.Name) {
		return fmt.Errorf("tool name %q: use 1 to 64 letters, digits, _ or -", spec.Name)
	}
	if c, ok := t.Tool.(tool.Checker); ok {
		if err := c.Check(); err != nil {
			return fmt.Errorf("tool %s: %w", spec.Name, err)
		}
	}
	if p := checkToolBudget(t.Budget); p != "" {
		return fmt.Errorf("tool %s: %s", spec.Name, p)
	}
	return nil
}

// checkToolBudget says what is wrong with a tool's budget given in code,
// as config.Load says it of one in a file; "" when nothing is.
func checkToolBudget(b budget.ToolBudget) string {
	for _, d := range []struct {
		name string
		v    budget.Duration
	}{{"Budget.Timeout", b.Timeout}, {"Budget.IdleTimeout", b.IdleTimeout}, {"Budget.KillGrace", b.KillGrace}} {
		if d.v.D < 0 {
			return fmt.Sprintf("%s %v is negative (use a duration such as 30s, or leave it zero for the agent's)", d.name, d.v.D)
		}
	}
	if b.Timeout.D == 0 && b.Timeout.Source != "" {
		return "Budget.Timeout is 0 with a source: every tool call needs a time limit (leave it unset for timeouts.tool; never to interrupt the tool, keep a timeout and set Enforcement: budget.Advisory)"
	}
	if b.Enforcement != "" && !b.Enforcement.Valid() {
		return fmt.Sprintf("Budget.Enforcement %q is not an enforcement mode (use budget.Hard, budget.Cooperative or budget.Advisory)", b.Enforcement)
	}
	return ""
}

// toolBudget fills the zero fields of a tool's budget from the agent's. A
// value set in Go code without a source has source "code".
func (a *Agent) toolBudget(t tool.Tool, b budget.ToolBudget) budget.ToolBudget {
	if b.Timeout.D <= 0 {
		b.Timeout = a.budgets.Tool
	}
	if b.Timeout.Source == "" {
		b.Timeout.Source = budget.SourceCode
	}
	if b.IdleTimeout.Source == "" && b.IdleTimeout.D > 0 {
		b.IdleTimeout.Source = budget.SourceCode
	}
	if b.Enforcement == "" {
		b.Enforcement = tool.DefaultEnforcement(t.Kind())
	}
	if b.KillGrace.Unset() {
		b.KillGrace = a.budgets.KillGrace
	}
	if b.IdleTimeout.Knob == "" && b.IdleTimeout.D > 0 {
		b.IdleTimeout.Knob = fmt.Sprintf("tools[%s].idle_timeout", t.Spec().Name)
	}
	if b.Timeout.Knob == "" {
		b.Timeout.Knob = fmt.Sprintf("tools[%s].timeout", t.Spec().Name)
	}
	return b
}

// withDefaults fills the budgets and limits cfg left unset from the
// defaults of budget.Knobs. A value set in Go code without a source has
// source "code".
func withDefaults(b budget.Budgets, l budget.Limits) (budget.Budgets, budget.Limits) {
	db, dl := budget.Defaults(), budget.DefaultLimits()
	for _, k := range budget.Knobs {
		if v, def := k.Duration(&b), k.Duration(&db); v != nil {
			if v.Unset() {
				*v = *def
			}
			if v.Source == "" {
				v.Source = budget.SourceCode
			}
			if v.Knob == "" {
				v.Knob = def.Knob
			}
			continue
		}
		v, def := k.Count(&l), k.Count(&dl)
		if v.N <= 0 {
			*v = *def
		}
		if v.Source == "" {
			v.Source = budget.SourceCode
		}
		if v.Knob == "" {
			v.Knob = def.Knob
		}
	}
	return b, l
}

// TurnBudgets returns the budgets a turn asking for r runs under: the
// agent's, with r's values (source "request"). It returns a
// *budget.RequestError for a value r may not set: an unknown or malformed
// one, or one over its ceiling (Config.RequestMax).
func (a *Agent) TurnBudgets(r budget.Request) (budget.Budgets, budget.Limits, error) {
	return r.Apply(a.budgets, a.limits, a.requestMax)
}

// requestBudgets is TurnBudgets leaving each refused value at the agent's.
func (a *Agent) requestBudgets(r budget.Request) (budget.Budgets, budget.Limits) {
	b, l := a.budgets, a.limits
	for name, v := range r {
		if nb, nl, err := (budget.Request{name: v}).Apply(b, l, a.requestMax); err == nil {
			b, l = nb, nl
		}
	}
	return b, l
}

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// Budgets returns the agent's resolved turn budgets.
func (a *Agent) Budgets() budget.Budgets { return a.budgets }

// Limits returns the agent's resolved limits.
func (a *Agent) Limits() budget.Limits { return a.limits }

// Tools returns the agent's tools with their resolved budgets, in order.
func (a *Agent) Tools() []Tool {
	out := make([]Tool, 0, len(a.order))
	for _, n := range a.order {
		out = append(out, a.tools[n].Tool)
	}
	return out
}

// Models returns the failover chain.
func (a *Agent) Models() []model.Endpoint { return append([]model.Endpoint(nil), a.models...) }

// NewTurnID returns a fresh random turn id.
func NewTurnID() string { return ids.New("t_") }
