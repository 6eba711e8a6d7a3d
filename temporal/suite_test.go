package temporal

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.temporal.io/sdk/testsuite"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// suite is a turn's workflow in Temporal's test environment, with the
// real activities, a real agent and an in-memory store: no dev server.
type suite struct {
	testsuite.WorkflowTestSuite
	env   *testsuite.TestWorkflowEnvironment
	store *store.Memory
	units machine.Units
}

func newSuite(t *testing.T, a *agent.Agent) *suite {
	t.Helper()
	s := &suite{store: store.NewMemory()}
	t.Cleanup(func() { s.store.Close() })
	s.SetLogger(quietLogger{})
	s.env = s.NewTestWorkflowEnvironment()
	units, ok := machine.UnitsOf(a)
	if !ok {
		t.Fatal("no units")
	}
	s.units = units
	register(s.env, units, s.store, s.store, time.Second, slog.New(slog.DiscardHandler))
	return s
}

// start begins turn id as a Runner does, and returns its first state.
func (s *suite) start(t *testing.T, id, text string) machine.State {
	t.Helper()
	st, history := s.units.NewState(id, "", nil, nil)
	if err := s.store.BeginTurn(context.Background(), store.TurnStart{TurnID: id, Engine: Engine, Input: text, StartedAt: st.Start}); err != nil {
		t.Fatal(err)
	}
	if err := putInput(context.Background(), s.store, id, text, history); err != nil {
		t.Fatal(err)
	}
	return *st
}

// run runs the workflow of a turn begun by start to its end and returns
// its stored record.
func (s *suite) run(t *testing.T, st machine.State) (*Outcome, *event.Turn) {
	t.Helper()
	s.env.ExecuteWorkflow(WorkflowName, st)
	if !s.env.IsWorkflowCompleted() {
		t.Fatal("the workflow did not complete")
	}
	var out Outcome
	if err := s.env.GetWorkflowResult(&out); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	rec, err := s.store.Turn(context.Background(), st.TurnID)
	if err != nil {
		t.Fatal(err)
	}
	return &out, rec
}

type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

func scriptAgent(t *testing.T, lines string, tools ...agent.Tool) *agent.Agent {
	t.Helper()
	ls, err := script.Parse(stringsReader(lines), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(ls)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Name: "suite", Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
		Tools: tools, Budgets: budget.Budgets{KillGrace: budget.Duration{D: 100 * time.Millisecond, Source: budget.SourceCode}}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func echoTool() agent.Tool {
	return agent.Tool{Tool: tool.NewFunc("echo", "echoes", nil, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
		return "echo " + string(in), nil
	})}
}

func TestSuiteTurn(t *testing.T) {
	a := scriptAgent(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}
{"text": "done"}
`, echoTool())
	s := newSuite(t, a)
	out, rec := s.run(t, s.start(t, "t1", "go"))
	if out.Status != budget.StatusCompleted || rec.Answer != "done" {
		t.Fatalf("turn ended %s/%s: %s", rec.Status, rec.StopReason, rec.Message)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeOK {
		t.Fatalf("tool calls: %+v", rec.ToolCalls)
	}
}

func stringsReader(s string) *stringsR { return &stringsR{s: s} }

type stringsR struct{ s string }

func (r *stringsR) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p, r.s)
	r.s = r.s[n:]
	return n, nil
}
