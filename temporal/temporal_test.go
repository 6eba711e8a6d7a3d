package temporal_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.uber.org/goleak"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/telemetry"
	"github.com/timebox-run/timebox/temporal"
)

// TestMain stops the shared dev server and PostgreSQL cluster, then checks
// that no goroutine outlived the tests: workers stopped, clients closed.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopTemporal()
	testenv.StopPostgres()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// AgentFile writes the agent of the scenario into dir: a step that
// calls a quick tool (which counts its runs in a file) and one hung past
// its 1s timeout, then a step that calls a slower tool, then the answer.
// slow is the slower tool's command.
func agentFile(t *testing.T, dir, slow string) string {
	t.Helper()
	script := `{"tool_calls": [{"name": "quick"}, {"name": "hung"}]}
{"tool_calls": [{"name": "slow"}]}
{"text": "All done."}
`
	yaml := fmt.Sprintf(`name: temporal-test
model:
  primary: script:test
providers:
  script:
    file: script.jsonl
timeouts:
  kill_grace: 500ms
  turn: 1m
tools:
  - name: quick
    description: Counts its runs.
    exec: [sh, -c, 'echo run >> %[1]s/quick.count; echo quick done']
    timeout: 5s
  - name: hung
    description: Hangs.
    exec: [sleep, "30"]
    timeout: 1s
  - name: slow
    description: Slower.
    exec: [sh, -c, %[2]q]
    timeout: 30s
`, dir, slow)
	for name, text := range map[string]string{"script.jsonl": script, "agent.yaml": yaml} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "agent.yaml")
}

// setup returns a Temporal client and a PostgreSQL store for one test, on
// its own task queue.
func setup(t testing.TB) (client.Client, store.Store, string) {
	t.Helper()
	c, s, queue, _ := setupDSN(t)
	return c, s, queue
}

// setupDSN is setup, with the address of the store's database.
func setupDSN(t testing.TB) (client.Client, store.Store, string, string) {
	t.Helper()
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c, s, "tq-" + strings.ReplaceAll(t.Name(), "/", "-"), dsn
}

// openAgent opens the agent of file, closed when tb ends.
func openAgent(tb testing.TB, file string) *timebox.Agent {
	tb.Helper()
	a, err := timebox.Open(context.Background(), file, timebox.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	return a
}

// openTraced opens the agent of file traced to tp, closed when tb ends.
func openTraced(tb testing.TB, file string, tp trace.TracerProvider) *agent.Agent {
	tb.Helper()
	a, err := timebox.Open(context.Background(), file, timebox.Options{TracerProvider: tp})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	return a.Agent
}

// recorded returns a tracer provider that gives the ids a span's context
// asks for (telemetry.IDs), as timebox's does, and the recorder of the
// spans it ends; it is shut down when tb ends.
func recorded(tb testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(telemetry.IDs{}))
	tb.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// onBoth runs a turn of the agent of file twice: on the embedded engine,
// and on Temporal with a worker of its own, whose client it returns.
func onBoth(t *testing.T, file string) (embedded, onTemporal *agent.Result, c client.Client) {
	t.Helper()
	c, s, queue := setup(t)
	embedded = openAgent(t, file).Run(context.Background(), agent.Input{Text: "go"})
	a := openAgent(t, file)
	startWorker(t, c, s, queue, a.Agent)
	r, _ := temporal.NewRunner(c, s, queue, a.Agent)
	return embedded, r.Run(context.Background(), agent.Input{Text: "go"}), c
}

func startWorker(t testing.TB, c client.Client, s store.Store, queue string, a *agent.Agent) {
	t.Helper()
	t.Cleanup(runningWorker(t, c, queue, a, s).Stop)
}

// startRun starts turn id ("go") on queue with a runner of agent a and
// store s, and returns where its result comes.
func startRun(t *testing.T, c client.Client, s store.Store, queue string, a *agent.Agent, id string) <-chan *agent.Result {
	t.Helper()
	r, err := temporal.NewRunner(c, s, queue, a)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *agent.Result, 1)
	go func() { done <- r.Run(context.Background(), agent.Input{TurnID: id, Text: "go"}) }()
	return done
}

// runningWorker starts a worker of a on queue, storing in s, with a 1s
// heartbeat; the caller stops it.
func runningWorker(t testing.TB, c client.Client, queue string, a *agent.Agent, s store.Store) worker.Worker {
	t.Helper()
	w, err := temporal.NewWorker(temporal.WorkerOptions{Client: c, TaskQueue: queue, Agent: a, Store: s, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}

// slowAttemptAgent writes, in a directory of t's, an agent named name
// whose script model answers "done" 2s after it is asked: slow enough for
// a worker to die or stop while the attempt streams. It returns the file.
func slowAttemptAgent(t *testing.T, name string) string {
	return slowAttemptAgentOf(t, name, "2s", "1m")
}

// slowAttemptAgentOf is slowAttemptAgent with the model's first chunk
// delay and the turn's ceiling.
func slowAttemptAgentOf(t *testing.T, name, delay, turn string) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "done", "first_chunk_delay": "`+delay+`"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: "+name+"\nmodel: {primary: script:test}\nproviders: {script: {file: script.jsonl}}\n"+
		"timeouts: {turn: "+turn+", llm_first_chunk: 30s}\n"), 0o644)
	return file
}

// waitStored waits until turn id has an event of type typ in s.
func waitStored(t *testing.T, s store.Store, id string, typ event.Type, what string) {
	t.Helper()
	wait.For(t, 30*time.Second, what, func() bool {
		evs, _ := s.Events(context.Background(), id, 0, 0)
		for _, e := range evs {
			if e.Type == typ {
				return true
			}
		}
		return false
	})
}

func TestTurnOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	a, err := timebox.Open(context.Background(), agentFile(t, dir, "sleep 0.2; echo slow done"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	startWorker(t, c, s, queue, a.Agent)
	r, err := temporal.NewRunner(c, s, queue, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	var seen []event.Event
	res := r.Run(context.Background(), agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) { seen = append(seen, e) }))
	rec := res.Record
	if rec.Status != budget.StatusCompleted || rec.Answer != "All done." {
		t.Fatalf("turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	hung := callNamed(t, rec, "hung")
	if hung.Outcome != event.OutcomeTimedOut || hung.Phase != budget.PhaseTool {
		t.Errorf("hung call: outcome %s phase %s, want timed_out at its own budget (tool)", hung.Outcome, hung.Phase)
	}
	// About its 1s timeout (plus its kill grace at worst), not a Temporal
	// retry or the activity's StartToClose.
	if d := time.Duration(hung.DurationMS) * time.Millisecond; d < time.Second || d > 3*time.Second {
		t.Errorf("hung call took %v, want about 1s", d)
	}
	if n := runs(t, dir); n != 1 {
		t.Errorf("the quick tool ran %d times, want 1", n)
	}
	// Every stored event reached the sinks, in seq order with no gap.
	for i, e := range seen {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	if len(seen) == 0 || seen[len(seen)-1].Type != event.TypeTurnFinished {
		t.Errorf("the last event followed is not turn_finished")
	}
	if len(rec.Events) != len(seen) {
		t.Errorf("the record has %d events, the sinks got %d", len(rec.Events), len(seen))
	}
}

// TestSameShapeAsEmbedded runs the same turn on the embedded engine and on
// Temporal and compares what a user sees: the events of each kind, each
// call's record and the turn's record, ignoring ids and times.
func TestSameShapeAsEmbedded(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	embedded, onTemporal, _ := onBoth(t, agentFile(t, t.TempDir(), "sleep 0.2; echo slow done"))

	if diff := cmp.Diff(shape(embedded.Record), shape(onTemporal.Record)); diff != "" {
		t.Errorf("the turn on Temporal differs from the embedded one (-embedded +temporal):\n%s", diff)
	}
	// A tool_error's elapsed time differs by a millisecond or two, and so
	// does the time a result tells the model it took.
	elapsed := cmp.Transformer("elapsed", func(s string) string {
		return tookRE.ReplaceAllString(elapsedRE.ReplaceAllString(s, `"elapsed":"…"`), "[timebox: took … of")
	})
	opts := []cmp.Option{
		elapsed,
		cmpopts.IgnoreFields(event.ToolCall{}, "TurnID", "StartedAt", "EndedAt", "DurationMS", "StderrTail"),
		cmpopts.IgnoreFields(event.ModelCall{}, "StartedAt", "FirstChunkMS", "StreamMS"),
		cmpopts.SortSlices(func(a, b event.ToolCall) bool { return a.CallID < b.CallID }),
	}
	if diff := cmp.Diff(embedded.Record.ToolCalls, onTemporal.Record.ToolCalls, opts...); diff != "" {
		t.Errorf("tool call records differ (-embedded +temporal):\n%s", diff)
	}
	if diff := cmp.Diff(embedded.Record.ModelCalls, onTemporal.Record.ModelCalls, opts...); diff != "" {
		t.Errorf("model call records differ (-embedded +temporal):\n%s", diff)
	}
	if diff := cmp.Diff(embedded.Messages, onTemporal.Messages, elapsed); diff != "" {
		t.Errorf("messages differ (-embedded +temporal):\n%s", diff)
	}
}

var (
	elapsedRE = regexp.MustCompile(`"elapsed":"[0-9.]+m?s"`)
	tookRE    = regexp.MustCompile(`\[timebox: took [0-9.hms]+ of`)
)

// turnShape is what a user sees of a turn, without ids and times.
type turnShape struct {
	Status     budget.Status
	StopReason budget.StopReason
	Answer     string
	Steps      int
	Flags      event.Flags
	// Events are "type call_id" of every event, sorted: units of one batch
	// emit concurrently on both engines, so only the set is the same.
	// A step's llm_delta events are one entry "llm_delta step N": chunks
	// that arrive while the sinks are busy go as one delta (modelstep.go),
	// so their number follows the machine's load, not the engine; their
	// text is the answer, compared whole.
	Events []string
}

func shape(rec *event.Turn) turnShape {
	s := turnShape{Status: rec.Status, StopReason: rec.StopReason, Answer: rec.Answer, Steps: rec.Steps, Flags: rec.Flags}
	deltas := map[int]bool{}
	for _, e := range rec.Events {
		id := ""
		switch d := e.Data.(type) {
		case *event.LLMDelta:
			if deltas[d.Step] {
				continue
			}
			deltas[d.Step] = true
			id = fmt.Sprintf("step %d", d.Step)
		case *event.ToolStarted:
			id = d.CallID
		case *event.ToolFinished:
			id = d.CallID
		case *event.ToolProgress:
			id = d.CallID
		}
		s.Events = append(s.Events, strings.TrimSpace(string(e.Type)+" "+id))
	}
	sort.Strings(s.Events)
	return s
}

func callNamed(t *testing.T, rec *event.Turn, name string) event.ToolCall {
	t.Helper()
	for _, c := range rec.ToolCalls {
		if c.Tool == name {
			return c
		}
	}
	t.Fatalf("no call of %s in the record: %+v", name, rec.ToolCalls)
	return event.ToolCall{}
}

func runs(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "quick.count"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run")
}

// stopAgent writes an agent whose only step calls a tool that runs for
// 30s under a 20s timeout: the turn's ceiling (turn) or a cancellation
// stops it.
func stopAgent(t *testing.T, turn string) string {
	t.Helper()
	return hangAgent(t, "turn: "+turn, "20s")
}

// hangAgent writes the agent of stopAgent with timeouts (and a kill grace
// of 500ms) and the tool's own timeout.
func hangAgent(t *testing.T, timeouts, toolTimeout string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "long"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(fmt.Sprintf(`name: stops
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {%s, kill_grace: 500ms}
tools:
  - name: long
    exec: [sleep, "30"]
    timeout: %s
`, timeouts, toolTimeout)), 0o644)
	return filepath.Join(dir, "agent.yaml")
}

// digits hides the figures of a message, durations whole ("after 2.1s",
// "running for 900ms").
var digits = regexp.MustCompile(`([0-9]+(\.[0-9]+)?(ns|µs|ms|s|m|h))+|[0-9]+(\.[0-9]+)?`)

// TestStopsAsEmbedded checks that a turn stopped by its ceiling during a
// tool call, and one cancelled by its caller, end on Temporal with the
// turn_finished of the embedded engine: stop reason, message, flags and
// the budget that stopped it — and within the same time.
func TestStopsAsEmbedded(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	for _, tc := range []struct {
		name   string
		turn   string
		cancel time.Duration
	}{
		{name: "ceiling", turn: "2s"},
		{name: "cancel", turn: "1m", cancel: 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := stopAgent(t, tc.turn)
			run := func(r interface {
				Run(context.Context, agent.Input, ...event.Sink) *agent.Result
			}) (*event.TurnFinished, time.Duration) {
				ctx := context.Background()
				if tc.cancel > 0 {
					var cancel context.CancelCauseFunc
					ctx, cancel = context.WithCancelCause(ctx)
					timer := time.AfterFunc(tc.cancel, func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the test"}) })
					defer timer.Stop()
				}
				start := time.Now()
				res := r.Run(ctx, agent.Input{Text: "go"})
				wall := time.Since(start)
				if len(res.Record.Events) == 0 {
					t.Fatalf("no events: %s (%s): %s", res.Record.Status, res.Record.StopReason, res.Record.Message)
				}
				last := res.Record.Events[len(res.Record.Events)-1]
				fin, ok := last.Data.(*event.TurnFinished)
				if !ok {
					t.Fatalf("the last event is %s", last.Type)
				}
				return fin, wall
			}
			embedded, embeddedWall := run(openAgent(t, file))
			a := openAgent(t, file)
			startWorker(t, c, s, queue+"-"+tc.name, a.Agent)
			r, _ := temporal.NewRunner(c, s, queue+"-"+tc.name, a.Agent)
			onTemporal, temporalWall := run(r)
			t.Logf("embedded ended in %v, Temporal in %v", embeddedWall.Round(time.Millisecond), temporalWall.Round(time.Millisecond))

			norm := func(f *event.TurnFinished) event.TurnFinished {
				n := *f
				n.Message = digits.ReplaceAllString(n.Message, "N")
				n.Totals = event.Totals{}
				return n
			}
			if diff := cmp.Diff(norm(embedded), norm(onTemporal)); diff != "" {
				t.Errorf("turn_finished differs (-embedded +temporal):\n%s", diff)
			}
			if d := temporalWall - embeddedWall; d > 2*time.Second {
				t.Errorf("the turn took %v longer to stop on Temporal", d)
			}
		})
	}
}

// TestCancelWithoutWorker: a turn started while no worker runs, then
// cancelled, ends — its workflow terminated, its record interrupted and
// saying why — instead of waiting for a worker for ever.
func TestCancelWithoutWorker(t *testing.T) {
	c, s, queue := setup(t)
	defer func(d time.Duration) { temporal.CancelWait = d }(temporal.CancelWait)
	temporal.CancelWait = 500 * time.Millisecond
	a, err := timebox.Open(context.Background(), stopAgent(t, "1m"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r, err := temporal.NewRunner(c, s, queue, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	res := r.Run(ctx, agent.Input{Text: "go"})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run returned after %v", d)
	}
	if res.Record.Status != budget.StatusInterrupted || !strings.Contains(res.Record.Message, "no timebox worker") {
		t.Errorf("record: %s: %s", res.Record.Status, res.Record.Message)
	}
	// Cancelled at 1s, ended CancelWait later: it ran 1.5s, which is
	// said, not "at least 0s" (the crash template: its last stored event).
	checkKnownEnd(t, res.Record, 1500*time.Millisecond, time.Since(start))
	desc, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(res.Record.TurnID), "")
	if err != nil {
		t.Fatal(err)
	}
	if st := desc.WorkflowExecutionInfo.Status.String(); st != "Terminated" {
		t.Errorf("the workflow is %s, want Terminated", st)
	}
}

// checkKnownEnd checks the end of a cancelled turn no worker ran: it ran
// from at least to at most (as the test's clock saw), its wall time says
// so, and its message says how long it ran, not the crash template's
// "at least" until its last stored event.
func checkKnownEnd(t *testing.T, rec *event.Turn, least, most time.Duration) {
	t.Helper()
	wall := time.Duration(rec.WallMS) * time.Millisecond
	if wall < least-100*time.Millisecond || wall > most+100*time.Millisecond || rec.EndedAt.Sub(rec.StartedAt).Milliseconds() != rec.WallMS {
		t.Errorf("wall_ms %d, ended_at %s after it started: want %s to %s", rec.WallMS, rec.EndedAt.Sub(rec.StartedAt), least, most)
	}
	if want := "Cancelled after " + budget.RoundHuman(wall).String() + ": "; !strings.HasPrefix(rec.Message, want) ||
		strings.Contains(rec.Message, "at least") || !strings.Contains(rec.Message, "Nothing of it ran.") {
		t.Errorf("message %q, want it to begin %q and say nothing of it ran", rec.Message, want)
	}
}

// TestCancelWithoutWorkerOnAnotherGateway: a turn no worker runs, whose
// gateway is gone (it stopped following it), is cancelled on another
// gateway: that one tells the workflow through Temporal, and when no
// worker polls the turn's task queue, terminates it and ends the turn,
// saying so — rather than leave it running until a worker starts.
func TestCancelWithoutWorkerOnAnotherGateway(t *testing.T) {
	c, s, queue := setup(t)
	a, err := timebox.Open(context.Background(), stopAgent(t, "1m"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	gone, err := temporal.NewRunner(c, s, queue, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	// The first gateway starts the turn and goes (its store, shared with
	// the second, lives on: the turn's caller is not gone).
	id := "t_" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_"))
	ctx, stopFollowing := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gone.Run(ctx, agent.Input{TurnID: id, Text: "go"})
	}()
	wait.For(t, 30*time.Second, "the turn stored", func() bool {
		rec, err := s.Turn(context.Background(), id)
		return err == nil && rec.Status == budget.StatusRunning
	})
	stopFollowing(agent.ErrStopFollowing)
	<-done
	other, err := temporal.NewRunner(c, s, queue, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Agent: other, AgentName: "stop", Store: s})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	cancelled := time.Now()
	rec := postJSON[event.Turn](t, hs.URL+"/v1/turns/"+id+"/cancel", nil, http.StatusOK)
	if rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "no timebox worker") || !strings.Contains(rec.Message, queue) {
		t.Errorf("record: %s: %s", rec.Status, rec.Message)
	}
	// It ran at least until the end of the cancel's 10s wait.
	checkKnownEnd(t, &rec, time.Since(rec.StartedAt)-time.Since(cancelled)+10*time.Second, time.Since(rec.StartedAt))
	desc, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	if st := desc.WorkflowExecutionInfo.Status.String(); st != "Terminated" {
		t.Errorf("the workflow is %s, want Terminated", st)
	}
}

// TestASessionSummaryOnTemporal: a session turn on Temporal that starts
// from the summary an earlier turn left sends it and only what came after
// it, as the embedded engine does (docs/decisions/session-summaries.md).
func TestASessionSummaryOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "the next answer", "expect_in_request": ["They asked four questions.", "and now?", "the answer"]}`+"\n"), 0o644)
	p := filepath.Join(dir, "agent.yaml")
	os.WriteFile(p, []byte("name: summaries\nmodel: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ncontext: {compact_at: 500}\n"), 0o644)
	a, err := timebox.Open(context.Background(), p, timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q := queue + "-summary"
	startWorker(t, c, s, q, a.Agent)
	r, err := temporal.NewRunner(c, s, q, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	var history []model.Message
	for i := range 4 {
		history = append(history, model.Message{Role: model.RoleUser, Content: strings.Repeat("question ", 100) + fmt.Sprint(i)},
			model.Message{Role: model.RoleAssistant, Content: strings.Repeat("answer ", 150)})
	}
	history = append(history, model.Message{Role: model.RoleUser, Content: "and now?"}, model.Message{Role: model.RoleAssistant, Content: "the answer"},
		model.Message{Role: model.RoleSummary, Content: "They asked four questions.", Covers: 8})
	var compactions int
	res := r.Run(context.Background(), agent.Input{SessionID: "sum", History: history, Text: "and then?"}, event.SinkFunc(func(e event.Event) {
		if e.Type == event.TypeCompactionStarted {
			compactions++
		}
	}))
	if rec := res.Record; rec.StopReason != budget.Answered || compactions != 0 {
		t.Fatalf("turn ended %s after %d compactions: %s", rec.StopReason, compactions, rec.Message)
	}
}

// TestStopFollowingLeavesTheTurnRunning: a Run stopped with
// agent.ErrStopFollowing (its gateway shutting down) returns at once without
// cancelling the turn, which its workers end as it would have ended.
func TestStopFollowingLeavesTheTurnRunning(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	a, err := timebox.Open(context.Background(), agentFile(t, dir, "sleep 1; echo slow done"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q := queue + "-stop-following"
	startWorker(t, c, s, q, a.Agent)
	r, err := temporal.NewRunner(c, s, q, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	id := stopFollowingMidTool(t, r)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rec, err := s.Turn(context.Background(), id)
		if err == nil && rec.Status != budget.StatusRunning {
			if rec.Status != budget.StatusCompleted || rec.Answer != "All done." {
				t.Fatalf("the turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the turn did not end on its workers")
		}
	}
}

// stopFollowingMidTool runs a turn with r and stops following it
// (agent.ErrStopFollowing, its gateway shutting down) once its first tool
// started; it checks that Run returned at once, the turn running, and
// returns the turn's id.
func stopFollowingMidTool(t *testing.T, r *temporal.Runner) string {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	started := make(chan string, 1)
	done := make(chan *agent.Result, 1)
	go func() {
		done <- r.Run(ctx, agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) {
			if e.Type == event.TypeToolStarted {
				select {
				case started <- e.TurnID:
				default:
				}
			}
		}))
	}()
	id := <-started
	cancel(agent.ErrStopFollowing)
	select {
	case res := <-done:
		if res.Record.Status != budget.StatusRunning {
			t.Errorf("the Run that stopped following says %s", res.Record.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Run did not return")
	}
	return id
}

// checkCeilingEnd fails t unless rec is the end the process following a
// turn (its runner, or a gateway that adopted it) gives it at its ceiling
// with no worker running it: 1.5s to 6s past it (its kill grace, 500ms,
// and CeilingGrace, then the next look, every 2s), stopped, turn_timeout,
// the embedded engine's message and flags for a tool named long running,
// and the sentence that no worker on queue ran it.
func checkCeilingEnd(t *testing.T, rec *event.Turn, ceiling time.Duration, queue string) {
	t.Helper()
	past := rec.EndedAt.Sub(rec.StartedAt.Add(ceiling))
	t.Logf("ended %v past its ceiling: %s", past.Round(time.Millisecond), rec.Message)
	if past < 1500*time.Millisecond || past > 6*time.Second {
		t.Errorf("ended %v past its ceiling, want 1.5s to 6s", past)
	}
	if rec.Status != budget.StatusStopped || rec.StopReason != budget.TurnTimeout {
		t.Errorf("ended %s (%s), want stopped (turn_timeout)", rec.Status, rec.StopReason)
	}
	if want := "Stopped after " + ceiling.String() + ", the limit for one turn (timeouts.turn). Last step: tool long, running for "; !strings.HasPrefix(rec.Message, want) ||
		!strings.Contains(rec.Message, "No timebox worker ran the turn on task queue "+queue+" ") ||
		!strings.Contains(rec.Message, "past its ceiling, and its workflow was terminated") {
		t.Errorf("message %q, want it to begin %q and say no worker ran the turn on %s", rec.Message, want, queue)
	}
	if !rec.Flags.TimedOutByTurnBudget || !rec.Flags.TimedOutDuringToolExecution {
		t.Errorf("flags %+v, want timed_out_by_turn_budget and timed_out_during_tool_execution", rec.Flags)
	}
}

// TestCeilingWithoutWorker: the only worker of a turn stops while a tool
// runs, and the turn's ceiling (6s) falls with no worker to enforce it.
// The process following the turn ends it, as the embedded engine would
// have — stopped, turn_timeout, "Last step: tool long, running for …",
// timed_out_by_turn_budget and timed_out_during_tool_execution — saying
// that no worker ran it, and terminates its workflow so that no worker
// starts it later. (It stayed running until a worker came.)
func TestCeilingWithoutWorker(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	const ceiling = 6 * time.Second
	rec, queue := endsWithoutWorker(t, stopAgent(t, ceiling.String()), ceiling+30*time.Second)
	checkCeilingEnd(t, rec, ceiling, queue)
	if fin := rec.Events[len(rec.Events)-1].Data.(*event.TurnFinished); fin.Limit == nil || fin.Limit.Key != budget.KeyTurn {
		t.Errorf("turn_finished's limit %+v, want timeouts.turn", fin.Limit)
	}
}

// TestStepWithoutWorker: the only worker of a turn stops while a tool
// runs, and the turn's step window (3s; the tool's own timeout, 5s, keeps
// it open to its deadline) ends with no worker to enforce it, long before
// its ceiling (1m). The process following the turn ends it, as the
// embedded engine would have — stopped, no_progress, "Stopped: nothing
// progressed for 3s (timeouts.step). Last step: tool long, running for
// …", timed_out_during_tool_execution, timeouts.step its limit — saying
// that no worker ran it, and terminates its workflow. (It stayed running
// until its ceiling.)
func TestStepWithoutWorker(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	const step, ceiling = 3 * time.Second, time.Minute
	rec, queue := endsWithoutWorker(t, hangAgent(t, "turn: 1m, step: 3s", "5s"), 30*time.Second)
	// The window ends at the tool's deadline, or 3s after the model's
	// last step ended, whichever is later.
	var window time.Time
	for _, e := range rec.Events {
		switch x := e.Data.(type) {
		case *event.LLMFinished:
			window = e.At.Add(step)
		case *event.ToolStarted:
			if x.Deadline.After(window) {
				window = x.Deadline
			}
		}
	}
	past := rec.EndedAt.Sub(window)
	t.Logf("ended %v past its step window, %v into the turn: %s", past.Round(time.Millisecond),
		rec.EndedAt.Sub(rec.StartedAt).Round(time.Millisecond), rec.Message)
	// The window, its kill grace (500ms) and CeilingGrace, then the
	// follower's next look (every 2s), and some slack; far from the
	// ceiling.
	if past < 1500*time.Millisecond || past > 6*time.Second || rec.EndedAt.Sub(rec.StartedAt) > ceiling/2 {
		t.Errorf("ended %v past its step window, %v into the turn; want 1.5s to 6s past it", past, rec.EndedAt.Sub(rec.StartedAt))
	}
	if rec.Status != budget.StatusStopped || rec.StopReason != budget.NoProgress {
		t.Errorf("ended %s (%s), want stopped (no_progress)", rec.Status, rec.StopReason)
	}
	if want := "Stopped: nothing progressed for 3s (timeouts.step). Last step: tool long, running for 5s. " +
		"The tool was past its own timeout and reported no progress; have it report progress, or raise its timeout or timeouts.step. " +
		"No timebox worker ran the turn on task queue " + queue + " "; !strings.HasPrefix(rec.Message, want) ||
		!strings.Contains(rec.Message, "past the end of its step window, and its workflow was terminated") {
		t.Errorf("message %q, want it to begin %q and say how far past the step window it stopped", rec.Message, want)
	}
	if rec.Flags.TimedOutByTurnBudget || !rec.Flags.TimedOutDuringToolExecution {
		t.Errorf("flags %+v, want timed_out_during_tool_execution alone", rec.Flags)
	}
	if fin := rec.Events[len(rec.Events)-1].Data.(*event.TurnFinished); fin.Limit == nil || fin.Limit.Key != budget.KeyStep || fin.Limit.Value != "3s" {
		t.Errorf("turn_finished's limit %+v, want timeouts.step, 3s", fin.Limit)
	}
}

// TestCeilingWithoutWorkerMidCompaction: the only worker of a turn stops
// while the turn compacts its history (the compaction's model call hangs),
// and the turn's ceiling (4s) falls with no worker to enforce it. The
// process following the turn ends it as the embedded engine would have —
// "Last step: compaction (model m), waiting for its reply (…)", flagged
// timed_out_by_turn_budget and timed_out_during_compaction. (It said
// "Last step: none", without the compaction's flag.)
func TestCeilingWithoutWorkerMidCompaction(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	const ceiling = 4 * time.Second
	file, in := hungCompactionAgent(t)
	rec, queue := endsWithoutWorkerAfter(t, file, in, event.TypeCompactionStarted, ceiling+30*time.Second)
	past := rec.EndedAt.Sub(rec.StartedAt.Add(ceiling))
	t.Logf("ended %v past its ceiling: %s", past.Round(time.Millisecond), rec.Message)
	// Its ceiling, its kill grace (500ms) and CeilingGrace, or the
	// workflow task's timeout (5s) and WorkerWait, then the follower's
	// next look (every 2s), and some slack.
	if past < 1500*time.Millisecond || past > 8*time.Second {
		t.Errorf("ended %v past its ceiling, want 1.5s to 8s", past)
	}
	if rec.Status != budget.StatusStopped || rec.StopReason != budget.TurnTimeout {
		t.Errorf("ended %s (%s), want stopped (turn_timeout)", rec.Status, rec.StopReason)
	}
	if want := "Stopped after 4s, the limit for one turn (timeouts.turn). Last step: compaction (model m), waiting for its reply ("; !strings.HasPrefix(rec.Message, want) ||
		!strings.Contains(rec.Message, "No timebox worker ran the turn on task queue "+queue+" ") {
		t.Errorf("message %q, want it to begin %q and say no worker ran the turn on %s", rec.Message, want, queue)
	}
	if rec.Flags != (event.Flags{TimedOutByTurnBudget: true, TimedOutDuringCompaction: true}) {
		t.Errorf("flags %+v, want timed_out_by_turn_budget and timed_out_during_compaction", rec.Flags)
	}
}

// hungCompactionAgent writes an agent named compacts whose turn's ceiling
// is 4s, and whose compaction's model call hangs, and returns its file and
// the input of a turn that compacts.
func hungCompactionAgent(t *testing.T) (string, agent.Input) {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"compaction": true, "chunks": ["never"], "first_chunk_delay": "1m"}`+"\n"+
		`{"text": "never"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(`name: compacts
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
context: {compact_at: 50}
timeouts: {turn: 4s, kill_grace: 500ms}
`), 0o644)
	history := []model.Message{{Role: model.RoleUser, Content: strings.Repeat("a long question ", 40)},
		{Role: model.RoleAssistant, Content: strings.Repeat("a long answer ", 40)}}
	return filepath.Join(dir, "agent.yaml"), agent.Input{SessionID: "s", History: history, Text: "and now?"}
}

// endsWithoutWorker runs a turn of the agent of file, whose tool hangs,
// with a worker that stops once the tool started, and none after it
// (WorkerWait 2s, CeilingGrace 1s); the turn must end within d. It
// returns the turn's record, its running call checked interrupted, its
// last event its turn_finished and its workflow terminated, and the task
// queue.
func endsWithoutWorker(t *testing.T, file string, d time.Duration) (*event.Turn, string) {
	t.Helper()
	rec, queue := endsWithoutWorkerAfter(t, file, agent.Input{Text: "go"}, event.TypeToolStarted, d)
	if c := callNamed(t, rec, "long"); c.Outcome != event.OutcomeInterrupted {
		t.Errorf("the running call ended %s, want interrupted", c.Outcome)
	}
	return rec, queue
}

// endsWithoutWorkerAfter is endsWithoutWorker for a turn of input whose
// worker stops once it stored an event of type after. The worker's store
// is closed first: like a worker killed (kill -9), it stores nothing of
// what it was doing (a compaction cut by its stop is not ended).
func endsWithoutWorkerAfter(t *testing.T, file string, in agent.Input, after event.Type, d time.Duration) (*event.Turn, string) {
	t.Helper()
	a := openAgent(t, file)
	return endsWithoutWorkerOf(t, a.Agent, a.Agent, in, after, d)
}

// endsWithoutWorkerOf is endsWithoutWorkerAfter with the worker's agent
// and the runner's (each its own TracerProvider, as two processes have).
func endsWithoutWorkerOf(t *testing.T, worker, runner *agent.Agent, in agent.Input, after event.Type, d time.Duration) (*event.Turn, string) {
	t.Helper()
	c, s, queue, dsn := setupDSN(t)
	defer func(w, g time.Duration) { temporal.WorkerWait, temporal.CeilingGrace = w, g }(temporal.WorkerWait, temporal.CeilingGrace)
	temporal.WorkerWait, temporal.CeilingGrace = 2*time.Second, time.Second
	ws, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := runningWorker(t, c, queue, worker, ws)
	r, err := temporal.NewRunner(c, s, queue, runner)
	if err != nil {
		t.Fatal(err)
	}
	id := "t_" + strings.ToLower(t.Name())
	in.TurnID = id
	started := make(chan struct{})
	var once sync.Once
	sink := event.SinkFunc(func(e event.Event) {
		if e.Type == after {
			once.Do(func() { close(started) })
		}
	})
	done := make(chan *agent.Result, 1)
	go func() { done <- r.Run(context.Background(), in, sink) }()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s", after)
	}
	ws.Close()
	w.Stop()
	var res *agent.Result
	select {
	case res = <-done:
	case <-time.After(d):
		t.Fatalf("the turn was still running %v after it started", d)
	}
	rec := res.Record
	if len(rec.Events) == 0 {
		t.Fatal("no events")
	}
	fin, ok := rec.Events[len(rec.Events)-1].Data.(*event.TurnFinished)
	if !ok || fin.Flags != rec.Flags || fin.Message != rec.Message {
		t.Fatalf("the last event is %+v, want the turn's turn_finished", rec.Events[len(rec.Events)-1].Data)
	}
	desc, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	if st := desc.WorkflowExecutionInfo.Status.String(); st != "Terminated" {
		t.Errorf("the workflow is %s, want Terminated", st)
	}
	return rec, queue
}
