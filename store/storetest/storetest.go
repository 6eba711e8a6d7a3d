// Package storetest is the behaviour every store.Store must have, as a test
// suite: an implementation's tests call Run with a function that opens an
// empty store.
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
//	}
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// Run runs the suite; open returns a new, empty store, which the suite
// closes.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"TurnLifecycle", testTurnLifecycle},
		{"BeginTwice", testBeginTwice},
		{"EventsAreIdempotentAndOrdered", testEvents},
		{"QueuedEventsCommitInOrder", testQueueOrder},
		{"FinishStoresWhatIsQueued", testFinishFlushes},
		{"UnknownTurn", testUnknown},
		{"LateResultSurvivesFinish", testLateResult},
		{"EndWritesWhatTheQueueDidNot", testEndWrites},
		{"FinishWithoutBegin", testFinishWithoutBegin},
		{"ListFiltersAndOrder", testList},
		{"SessionsAndHistory", testSessions},
		{"LongTexts", testLongTexts},
		{"Closed", testClosed},
		{"OneRunningTurnPerSession", testSessionBusy},
		{"WatchSignalsNewEvents", testWatch},
		{"CancelRequests", testCancel},
		{"Payloads", testPayloads},
		{"TurnWithoutResults", testTurnWithoutResults},
		{"NumberedEventsEndEachThingOnce", testNumberedEnds},
		{"Approvals", testApprovals},
		{"SuspendedTurns", testSuspended},
		{"WebhookDeliveries", testDeliveries},
		{"WebhookDeliveryFilters", testDeliveryFilters},
		{"WebhookDeliveryClaimsAreExclusive", testDeliveryClaimsAreExclusive},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			tc.fn(t, s)
		})
	}
}

// turn plays one turn into s through a store.Recorder, the way the server
// does: n tool calls (the second one timing out), then the answer.
type turn struct {
	id, session, input string
	start              time.Time
	em                 *event.Emitter
	rec                *store.Recorder
	tools              []event.ToolCall
	models             []event.ModelCall
}

var clock = time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)

func begin(t *testing.T, s store.Store, id, session, input string) *turn {
	t.Helper()
	return beginThrough(t, s, id, session, input, nil)
}

// beginThrough is begin with the turn's events passed through sink
// before its Recorder, when sink is not nil.
func beginThrough(t *testing.T, s store.Store, id, session, input string, sink func(event.Sink) event.Sink) *turn {
	t.Helper()
	clock = clock.Add(time.Second)
	tr := &turn{id: id, session: session, input: input, start: clock, rec: store.NewRecorder(s)}
	var to event.Sink = tr.rec
	if sink != nil {
		to = sink(tr.rec)
	}
	tr.em = event.NewEmitter(id, to)
	if err := tr.rec.Begin(context.Background(), store.TurnStart{TurnID: id, SessionID: session, Agent: "test", Input: input, StartedAt: tr.start}); err != nil {
		t.Fatal(err)
	}
	tr.em.Emit(&event.TurnStarted{SessionID: session, Agent: "test", Input: input, Model: "script:m"})
	return tr
}

func (tr *turn) model(step int, text string) {
	tr.em.Emit(&event.LLMStarted{Step: step, Model: "m", Provider: "script", Attempt: 1})
	tr.em.Emit(&event.LLMDelta{Step: step, Text: text})
	mc := event.ModelCall{Step: step, Model: "m", Provider: "script", Attempt: 1, StartedAt: tr.start, Outcome: event.OutcomeOK, StreamMS: 5}
	tr.models = append(tr.models, mc)
	tr.em.Emit(&event.LLMFinished{ModelCall: mc})
}

func (tr *turn) tool(step, n int, outcome event.Outcome) event.ToolCall {
	id := fmt.Sprintf("call_%d_%d", step, n)
	tr.em.Emit(&event.ToolStarted{Step: step, CallID: id, Tool: "echo", Kind: "go", TimeoutMS: 1000})
	tc := event.ToolCall{CallID: id, TurnID: tr.id, Step: step, Tool: "echo", Kind: "go", Arguments: json.RawMessage(`{"x":1}`),
		StartedAt: tr.start.Add(time.Duration(n) * time.Millisecond), EndedAt: tr.start.Add(time.Second), DurationMS: 1000,
		TimeoutMS: 1000, Outcome: outcome, Result: "r" + id}
	if outcome == event.OutcomeTimedOut {
		tc.Phase = budget.PhaseTool
	}
	tr.tools = append(tr.tools, tc)
	tr.em.Emit(&event.ToolFinished{ToolCall: tc})
	return tc
}

func (tr *turn) finish(t *testing.T, reason budget.StopReason, msgs ...model.Message) *event.Turn {
	t.Helper()
	end := tr.start.Add(2 * time.Second)
	rec := &event.Turn{TurnID: tr.id, SessionID: tr.session, Agent: "test", Input: tr.input, Status: reason.Status(),
		StopReason: reason, Message: "msg " + tr.id, Answer: "answer " + tr.id, StartedAt: tr.start, EndedAt: end,
		Steps: len(tr.models), WallMS: 2000, ToolCalls: tr.tools, ModelCalls: tr.models}
	tr.em.Emit(&event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message, Answer: rec.Answer, Totals: rec.Totals()})
	tr.em.Close()
	rec.Events = tr.em.Log()
	if err := tr.rec.Finish(context.Background(), rec, msgs); err != nil {
		t.Fatal(err)
	}
	return rec
}

func testTurnLifecycle(t *testing.T, s store.Store) {
	ctx := context.Background()
	tr := begin(t, s, "t1", "s1", "hello")
	tr.model(1, "let me see")
	tr.tool(1, 1, event.OutcomeOK)
	tr.tool(1, 2, event.OutcomeTimedOut)

	got, err := s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != budget.StatusRunning || got.Input != "hello" || got.SessionID != "s1" || got.Agent != "test" ||
		!got.StartedAt.Equal(tr.start) {
		t.Fatalf("running turn %+v", got)
	}
	if len(got.ToolCalls) != 2 || got.ToolCalls[1].Outcome != event.OutcomeTimedOut || got.ToolCalls[0].TurnID != "t1" ||
		got.ToolCalls[0].Result != "rcall_1_1" {
		t.Fatalf("running turn's tool calls %+v", got.ToolCalls)
	}
	if len(got.ModelCalls) != 1 || got.Steps != 1 {
		t.Fatalf("running turn's model calls %+v, steps %d", got.ModelCalls, got.Steps)
	}
	list, err := s.Turns(ctx, store.Filter{})
	if err != nil || len(list) != 1 || list[0].Status != budget.StatusRunning || list[0].EndedAt != nil ||
		list[0].Events != 8 || list[0].ToolCalls != 2 || list[0].Steps != 1 {
		t.Fatalf("list %+v, %v", list, err)
	}

	tr.model(2, "done")
	rec := tr.finish(t, budget.Answered, model.Message{Role: model.RoleUser, Content: "hello"})
	got, err = s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != budget.StatusCompleted || got.StopReason != budget.Answered || got.Message != rec.Message ||
		got.Answer != rec.Answer || got.WallMS != 2000 || got.Steps != 2 || !got.EndedAt.Equal(rec.EndedAt) {
		t.Fatalf("final turn %+v", got)
	}
	if len(got.ToolCalls) != 2 || len(got.ModelCalls) != 2 || got.Events != nil {
		t.Fatalf("final calls %d %d, events %d", len(got.ToolCalls), len(got.ModelCalls), len(got.Events))
	}
	evs, err := s.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != len(rec.Events) {
		t.Fatalf("%d events stored, %d emitted", len(evs), len(rec.Events))
	}
	for i, e := range evs {
		want, _ := json.Marshal(rec.Events[i])
		have, _ := json.Marshal(e)
		if string(want) != string(have) {
			t.Fatalf("event %d:\n got %s\nwant %s", i, have, want)
		}
	}
	if tf, ok := evs[len(evs)-1].Data.(*event.TurnFinished); !ok || tf.StopReason != budget.Answered {
		t.Fatalf("last event %+v", evs[len(evs)-1])
	}
}

func testBeginTwice(t *testing.T, s store.Store) {
	begin(t, s, "t1", "", "x")
	err := s.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Input: "y", StartedAt: time.Now()})
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second BeginTurn: %v", err)
	}
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	tr := begin(t, s, "t1", "", "x")
	for i := range 20 {
		tr.em.Emit(&event.LLMDelta{Step: 1, Text: fmt.Sprint(i)})
	}
	// A repeated seq (a retried write) changes nothing.
	dup := event.Event{Seq: 3, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now().UTC(), Data: &event.LLMDelta{Text: "dup"}}
	if err := s.AppendEvent(ctx, dup); err != nil {
		t.Fatal(err)
	}
	var all []event.Event
	after := int64(0)
	for {
		page, err := s.Events(ctx, "t1", after, 6)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 6 {
			t.Fatalf("page of %d", len(page))
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
	if len(all) != 21 {
		t.Fatalf("%d events", len(all))
	}
	for i, e := range all {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	if d := all[2].Data.(*event.LLMDelta); d.Text != "1" {
		t.Fatalf("duplicate overwrote: %q", d.Text)
	}
	if evs, err := s.Events(ctx, "t1", 21, 0); err != nil || len(evs) != 0 {
		t.Fatalf("after the last: %v %v", evs, err)
	}
}

func testUnknown(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.Turn(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Turn: %v", err)
	}
	if _, err := s.Events(ctx, "nope", 0, 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Events: %v", err)
	}
	e := event.Event{Seq: 1, TurnID: "nope", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{}}
	if err := s.AppendEvent(ctx, e); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AppendEvent: %v", err)
	}
	if err := s.UpdateToolCall(ctx, event.ToolCall{TurnID: "nope", CallID: "c"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateToolCall: %v", err)
	}
	if _, err := s.Session(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Session: %v", err)
	}
	if _, err := s.Turns(ctx, store.Filter{Before: "nope"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Turns before: %v", err)
	}
	if h, err := s.History(ctx, "nope"); err != nil || len(h) != 0 {
		t.Errorf("History: %v %v", h, err)
	}
}

func testLateResult(t *testing.T, s store.Store) {
	ctx := context.Background()
	tr := begin(t, s, "t1", "", "x")
	tc := tr.tool(1, 1, event.OutcomeAbandoned)
	// The late result lands before the turn's final record is stored, as
	// it may when the turn ends just as the abandoned call returns.
	late := tc
	late.LateResult, late.LateOutput = true, "finally"
	if err := s.UpdateToolCall(ctx, late); err != nil {
		t.Fatal(err)
	}
	tr.finish(t, budget.Answered)
	got, err := s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ToolCalls) != 1 || !got.ToolCalls[0].LateResult || got.ToolCalls[0].LateOutput != "finally" {
		t.Fatalf("late result lost: %+v", got.ToolCalls)
	}
}

func testFinishWithoutBegin(t *testing.T, s store.Store) {
	ctx := context.Background()
	em := event.NewEmitter("t9")
	em.Emit(&event.TurnStarted{Input: "q"})
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	rec := &event.Turn{TurnID: "t9", SessionID: "s9", Input: "q", Status: budget.StatusCompleted, StopReason: budget.Answered,
		StartedAt: clock, EndedAt: clock.Add(time.Second), Events: em.Log()}
	if err := s.FinishTurn(ctx, rec, []model.Message{{Role: model.RoleUser, Content: "q"}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Turn(ctx, "t9")
	if err != nil || got.Status != budget.StatusCompleted {
		t.Fatalf("%+v %v", got, err)
	}
	evs, err := s.Events(ctx, "t9", 0, 0)
	if err != nil || len(evs) != 2 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	if h, _ := s.History(ctx, "s9"); len(h) != 1 {
		t.Fatalf("history %v", h)
	}
}

func testList(t *testing.T, s store.Store) {
	ctx := context.Background()
	reasons := []budget.StopReason{budget.Answered, budget.TurnTimeout, budget.Answered, budget.ClientGone, budget.NoProgress}
	for i, r := range reasons {
		sess := "a"
		if i%2 == 1 {
			sess = "b"
		}
		tr := begin(t, s, fmt.Sprintf("t%d", i), sess, fmt.Sprintf("q%d", i))
		tr.finish(t, r)
	}
	begin(t, s, "t5", "a", "still going")
	ids := func(l []store.TurnSummary) string {
		var out string
		for _, x := range l {
			out += x.TurnID + " "
		}
		return out
	}
	cases := []struct {
		f    store.Filter
		want string
	}{
		{store.Filter{}, "t5 t4 t3 t2 t1 t0 "},
		{store.Filter{Limit: 2}, "t5 t4 "},
		{store.Filter{Before: "t4", Limit: 2}, "t3 t2 "},
		{store.Filter{Status: budget.StatusCompleted}, "t2 t0 "},
		{store.Filter{Status: budget.StatusStopped}, "t4 t1 "},
		{store.Filter{Status: budget.StatusRunning}, "t5 "},
		{store.Filter{StopReason: budget.ClientGone}, "t3 "},
		{store.Filter{SessionID: "a"}, "t5 t4 t2 t0 "},
		{store.Filter{SessionID: "a", Status: budget.StatusStopped}, "t4 "},
		{store.Filter{Status: budget.StatusFailed}, ""},
	}
	for _, tc := range cases {
		got, err := s.Turns(ctx, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if ids(got) != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.f, ids(got), tc.want)
		}
	}
	got, _ := s.Turns(ctx, store.Filter{StopReason: budget.TurnTimeout})
	if len(got) != 1 || got[0].Message != "msg t1" || got[0].Input != "q1" || got[0].EndedAt == nil || got[0].WallMS != 2000 {
		t.Errorf("summary %+v", got)
	}
}

func testSessions(t *testing.T, s store.Store) {
	ctx := context.Background()
	u1 := model.Message{Role: model.RoleUser, Content: "one"}
	a1 := model.Message{Role: model.RoleAssistant, Content: "", ToolCalls: []model.ToolCall{{ID: "x", Name: "echo", Arguments: "{}"}}}
	t1 := model.Message{Role: model.RoleTool, Content: "{}", ToolCallID: "x", ToolName: "echo"}
	a2 := model.Message{Role: model.RoleAssistant, Content: "first"}
	begin(t, s, "t1", "s1", "one").finish(t, budget.Answered, u1, a1, t1, a2)
	begin(t, s, "o1", "other", "elsewhere").finish(t, budget.Answered, model.Message{Role: model.RoleUser, Content: "elsewhere"})
	u2 := model.Message{Role: model.RoleUser, Content: "two"}
	begin(t, s, "t2", "s1", "two").finish(t, budget.Cancelled, u2)
	begin(t, s, "t3", "s1", "three") // still running: adds nothing yet

	h, err := s.History(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	want := []model.Message{u1, a1, t1, a2, u2}
	hj, _ := json.Marshal(h)
	wj, _ := json.Marshal(want)
	if string(hj) != string(wj) {
		t.Fatalf("history\n got %s\nwant %s", hj, wj)
	}
	sess, err := s.Session(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Turns) != 3 || sess.Turns[0].TurnID != "t1" || sess.Turns[2].Status != budget.StatusRunning {
		t.Fatalf("session turns %+v", sess.Turns)
	}
	if len(sess.Messages) != 5 || sess.Messages[4].TurnID != "t2" || sess.Messages[2].ToolCallID != "x" {
		t.Fatalf("session messages %+v", sess.Messages)
	}
	if sess.CreatedAt.After(sess.UpdatedAt) || sess.CreatedAt.IsZero() {
		t.Fatalf("session times %v %v", sess.CreatedAt, sess.UpdatedAt)
	}
	list, err := s.Sessions(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].SessionID != "s1" || list[0].Turns != 3 || list[0].Title != "one" || list[1].Title != "elsewhere" {
		t.Fatalf("sessions %+v", list)
	}
}

// LongAnswer is a turn's answer long enough for a store to keep it apart
// (issue 29): 700 KB of text of one to four bytes a character.
var LongAnswer = strings.Repeat("a long answer: é € 😀 <&> \"q\"\n", 700_000/38)

// LongTurn plays into s a turn of session whose answer and message are
// LongAnswer, whose conversation has a long tool result too, and returns
// what it stored: the record and the conversation.
func LongTurn(t *testing.T, s store.Store, id, session string) (*event.Turn, []model.Message) {
	t.Helper()
	tr := begin(t, s, id, session, "write at length")
	tr.model(1, LongAnswer)
	result := "a long result " + LongAnswer[:200_000]
	msgs := []model.Message{
		{Role: model.RoleUser, Content: "write at length"},
		{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "x", Name: "echo", Arguments: "{}"}}},
		{Role: model.RoleTool, Content: result, ToolCallID: "x", ToolName: "echo"},
		{Role: model.RoleAssistant, Content: LongAnswer},
	}
	end := tr.start.Add(2 * time.Second)
	rec := &event.Turn{TurnID: id, SessionID: session, Agent: "test", Input: tr.input, Status: budget.StatusCompleted,
		StopReason: budget.Answered, Message: LongAnswer, Answer: LongAnswer, StartedAt: tr.start, EndedAt: end,
		Steps: 1, WallMS: 2000, ModelCalls: tr.models}
	tr.em.Emit(&event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message, Answer: rec.Answer, Totals: rec.Totals()})
	tr.em.Close()
	rec.Events = tr.em.Log()
	if err := tr.rec.Finish(context.Background(), rec, msgs); err != nil {
		t.Fatal(err)
	}
	return rec, msgs
}

// StoredOnce checks, by a store's own SQL, that LongTurn(t, s, "l1", …)
// stored its texts once, in pieces of at most store.TextPiece, and that no
// row it names them from — turn_finished, the record and message, the
// messages — holds a copy. query runs a query; bytes is the SQL of a
// column's length in bytes, the column as %s.
func StoredOnce(t *testing.T, msgs []model.Message, bytes string, query func(q string) store.Rows) {
	t.Helper()
	rows := query(fmt.Sprintf(`SELECT name, COUNT(*), SUM(%[1]s), MAX(%[1]s) FROM texts WHERE turn_id = 'l1' GROUP BY name ORDER BY name`,
		fmt.Sprintf(bytes, "piece")))
	var got []string
	for rows.Next() {
		var name string
		var pieces, n, longest int
		if err := rows.Scan(&name, &pieces, &n, &longest); err != nil {
			t.Fatal(err)
		}
		got = append(got, name)
		want := map[string]int{"answer": len(LongAnswer), "content:2": len(msgs[2].Content)}[name]
		if n != want || longest > store.TextPiece || pieces < want/store.TextPiece {
			t.Errorf("text %s: %d bytes in %d pieces, the longest %d; want %d bytes in pieces of at most %d", name, n, pieces, longest, want, store.TextPiece)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "answer content:2" {
		t.Fatalf("texts %q, want the answer and the tool's result", got)
	}
	b := func(col string) string { return fmt.Sprintf(bytes, col) }
	for what, q := range map[string]string{
		"turn_finished": `SELECT MAX(` + b("data") + `) FROM events WHERE turn_id = 'l1' AND type = 'turn_finished'`,
		"the record":    `SELECT ` + b("record") + ` + ` + b("message") + ` FROM turns WHERE turn_id = 'l1'`,
		"the messages":  `SELECT MAX(` + b("message") + `) FROM messages WHERE turn_id = 'l1'`,
	} {
		rows := query(q)
		var n int
		for rows.Next() {
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
		}
		if n > 4096 {
			t.Errorf("%s holds %d bytes: a copy of a long text", what, n)
		}
	}
}

// testLongTexts: a long answer, message and tool result read back whole
// from every reader — the record, the events, the list, the session and
// its history — and the texts of one turn stay its own.
func testLongTexts(t *testing.T, s store.Store) {
	ctx := context.Background()
	rec, msgs := LongTurn(t, s, "l1", "ls")
	short := begin(t, s, "l2", "ls", "and briefly")
	short.model(1, "brief")
	short.finish(t, budget.Answered, model.Message{Role: model.RoleUser, Content: "and briefly"},
		model.Message{Role: model.RoleAssistant, Content: "answer l2"})

	got, err := s.Turn(ctx, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Answer != rec.Answer || got.Message != rec.Message {
		t.Fatalf("record: answer %d bytes, message %d bytes; want %d and %d", len(got.Answer), len(got.Message), len(rec.Answer), len(rec.Message))
	}
	events, err := s.Events(ctx, "l1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ej, _ := json.Marshal(events)
	wj, _ := json.Marshal(rec.Events)
	if !bytes.Equal(ej, wj) {
		t.Fatalf("events read back differ from those emitted (%d bytes against %d)", len(ej), len(wj))
	}
	list, err := s.Turns(ctx, store.Filter{SessionID: "ls"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[1].TurnID != "l1" || list[1].Message != LongAnswer || list[0].Message != "msg l2" {
		t.Fatalf("the list: %d turns, the long one's message %d bytes", len(list), len(list[len(list)-1].Message))
	}
	h, err := s.History(ctx, "ls")
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(msgs), model.Message{Role: model.RoleUser, Content: "and briefly"},
		model.Message{Role: model.RoleAssistant, Content: "answer l2"})
	hj, _ := json.Marshal(h)
	wj, _ = json.Marshal(want)
	if !bytes.Equal(hj, wj) {
		t.Fatalf("history differs: %d messages, %d bytes; want %d, %d", len(h), len(hj), len(want), len(wj))
	}
	sess, err := s.Session(ctx, "ls")
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Messages) != 6 || sess.Messages[2].Content != msgs[2].Content || sess.Messages[3].Content != LongAnswer ||
		sess.Messages[3].TurnID != "l1" || sess.Messages[5].Content != "answer l2" {
		t.Fatalf("session messages: %d", len(sess.Messages))
	}
	if r2, err := s.Turn(ctx, "l2"); err != nil || r2.Answer != "answer l2" {
		t.Fatalf("the short turn: %v", err)
	}
}

func testClosed(t *testing.T, s store.Store) {
	ctx := context.Background()
	begin(t, s, "t1", "", "x")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Turn(ctx, "t1"); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Turn after Close: %v", err)
	}
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t2"}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("BeginTurn after Close: %v", err)
	}
	var queued error
	s.QueueEvent(event.Event{Seq: 9, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{}},
		func(err error) { queued = err })
	if !errors.Is(queued, store.ErrClosed) {
		t.Errorf("QueueEvent after Close: committed with %v", queued)
	}
	if err := s.Flush(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
}

// delta is event seq of turn id: a one-character llm_delta.
func delta(id string, seq int64) event.Event {
	return event.Event{Seq: seq, TurnID: id, Type: event.TypeLLMDelta, At: clock.Add(time.Duration(seq)),
		Data: &event.LLMDelta{Step: 1, Text: fmt.Sprint(seq % 10)}}
}

// testQueueOrder: events queued by concurrent turns are committed in the
// order each turn queued them, and each one's callback runs once it can be
// read back, in that order — what lets the server publish an event to
// followers in its callback and followers replay the rest from the store
// without a gap.
func testQueueOrder(t *testing.T, s store.Store) {
	ctx := context.Background()
	const turns, perTurn = 4, 200
	var wg sync.WaitGroup
	errs := make(chan error, turns)
	for i := range turns {
		id := fmt.Sprintf("t%d", i)
		if err := s.BeginTurn(ctx, store.TurnStart{TurnID: id, Input: "x", StartedAt: clock}); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			var mu sync.Mutex
			var last int64
			var fail error
			for seq := int64(1); seq <= perTurn; seq++ {
				s.QueueEvent(delta(id, seq), func(err error) {
					mu.Lock()
					defer mu.Unlock()
					switch {
					case fail != nil:
					case err != nil:
						fail = fmt.Errorf("%s: event %d: %w", id, seq, err)
					case seq != last+1:
						fail = fmt.Errorf("%s: callback of event %d after that of %d", id, seq, last)
					default:
						// Committed before its callback: readable now.
						if evs, err := s.Events(ctx, id, seq-1, 1); err != nil || len(evs) != 1 || evs[0].Seq != seq {
							fail = fmt.Errorf("%s: in the callback of event %d, the store has %v (%v)", id, seq, evs, err)
						}
					}
					last = seq
				})
			}
			if err := s.Flush(ctx); err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if fail == nil && last != perTurn {
				fail = fmt.Errorf("%s: after Flush, the last callback was event %d of %d", id, last, perTurn)
			}
			if fail != nil {
				errs <- fail
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range turns {
		id := fmt.Sprintf("t%d", i)
		evs, err := s.Events(ctx, id, 0, 0)
		if err != nil || len(evs) != perTurn {
			t.Fatalf("%s: %d events stored, %v", id, len(evs), err)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) || e.Data.(*event.LLMDelta).Text != fmt.Sprint(e.Seq%10) {
				t.Fatalf("%s: event %d is %+v", id, j, e)
			}
		}
	}
	// A failed append fails its own callback only.
	var bad error
	s.QueueEvent(delta("nope", 1), func(err error) { bad = err })
	if err := s.Flush(ctx); err != nil || !errors.Is(bad, store.ErrNotFound) {
		t.Fatalf("Flush %v; an unknown turn's event committed with %v", err, bad)
	}
}

// testFinishFlushes: FinishTurn stores the events still queued before it
// returns — those its record does not list too — so a turn's stored
// events are complete once its end is stored, and a record that only a
// queued tool_finished carried is kept.
func testFinishFlushes(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x", StartedAt: clock}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	tc := event.ToolCall{CallID: "call_1_1", TurnID: "t1", Step: 1, Tool: "echo", Kind: "go", StartedAt: clock,
		EndedAt: clock.Add(time.Second), DurationMS: 1000, Outcome: event.OutcomeOK, ProgressCount: 7}
	for seq := int64(1); seq <= n; seq++ {
		e := delta("t1", seq)
		if seq == n/2 {
			e = event.Event{Seq: seq, TurnID: "t1", Type: event.TypeToolFinished, At: clock, Data: &event.ToolFinished{ToolCall: tc}}
		}
		s.QueueEvent(e, nil)
	}
	// The record lists neither the events nor the call: FinishTurn must
	// not finish before the queue is stored.
	rec := &event.Turn{TurnID: "t1", Input: "x", Status: budget.StatusCompleted, StopReason: budget.Answered, Message: "done",
		StartedAt: clock, EndedAt: clock.Add(2 * time.Second), WallMS: 2000}
	if err := s.FinishTurn(ctx, rec, nil); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, "t1", 0, 0)
	if err != nil || len(evs) != n || evs[n-1].Seq != n {
		t.Fatalf("after FinishTurn: %d of %d events stored, %v", len(evs), n, err)
	}
	got, err := s.Turn(ctx, "t1")
	if err != nil || got.Status != budget.StatusCompleted || len(got.ToolCalls) != 1 || got.ToolCalls[0].ProgressCount != 7 {
		t.Fatalf("after FinishTurn: %+v %v", got, err)
	}
}

// testSessionBusy: a session runs one turn at a time; a turn outside any
// session is never refused.
func testSessionBusy(t *testing.T, s store.Store) {
	ctx := context.Background()
	tr := begin(t, s, "t1", "s1", "first")
	err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t2", SessionID: "s1", Input: "second", StartedAt: clock})
	if !errors.Is(err, store.ErrSessionBusy) {
		t.Fatalf("second turn of a busy session: %v", err)
	}
	if _, err := s.Turn(ctx, "t2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused turn was stored: %v", err)
	}
	begin(t, s, "o1", "", "no session")
	begin(t, s, "o2", "", "no session either")
	tr.finish(t, budget.Answered)
	begin(t, s, "t2", "s1", "second")
}

// testWatch: a watcher is signalled when its turn's events are stored and
// when the turn ends, and reads them after the signal.
func testWatch(t *testing.T, s store.Store) {
	ctx := context.Background()
	wake, stop := s.Watch("t1") // before the turn exists: not an error
	defer stop()
	tr := begin(t, s, "t1", "", "x")
	read := func(after int64) []event.Event {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case <-wake:
			case <-deadline:
				t.Fatalf("no signal brought an event after %d within 10s", after)
			}
			evs, err := s.Events(ctx, "t1", after, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) > 0 {
				return evs
			}
		}
	}
	if evs := read(0); evs[0].Type != event.TypeTurnStarted {
		t.Fatalf("first event %+v", evs[0])
	}
	tr.model(1, "hello")
	last := int64(0)
	for last < 4 {
		evs := read(last)
		last = evs[len(evs)-1].Seq
	}
	// Signals are coalesced, never lost: with nothing new, the channel
	// holds at most one.
	select {
	case <-wake:
	default:
	}
	tr.finish(t, budget.Answered)
	for {
		evs := read(last)
		last = evs[len(evs)-1].Seq
		if evs[len(evs)-1].Type == event.TypeTurnFinished {
			break
		}
	}
	stop()
	stop() // idempotent
}

// testCancel: a cancel request for a running turn reaches the store's
// WatchCancel of that turn; an ended turn, or an unknown one, is refused.
func testCancel(t *testing.T, s store.Store) {
	ctx := context.Background()
	cancelled, stop := s.WatchCancel("t1")
	defer stop()
	other, stopOther := s.WatchCancel("t2")
	defer stopOther()
	tr := begin(t, s, "t1", "", "x")
	begin(t, s, "t2", "", "y")
	if err := s.RequestCancel(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the cancel request did not reach the turn within 10s")
	}
	select {
	case <-other:
		t.Fatal("the cancel request of t1 reached t2")
	case <-time.After(50 * time.Millisecond):
	}
	tr.finish(t, budget.Cancelled)
	if err := s.RequestCancel(ctx, "t1"); !errors.Is(err, store.ErrNotRunning) {
		t.Errorf("cancelling an ended turn: %v", err)
	}
	if err := s.RequestCancel(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancelling an unknown turn: %v", err)
	}
}

// testPayloads checks store.Payloads, for the stores that keep them: a
// value comes back as stored (bytes that are not text too), a later put
// replaces it, a range comes in key order and only with its prefix, and a
// missing key is ErrNotFound.
func testPayloads(t *testing.T, s store.Store) {
	p, ok := s.(store.Payloads)
	if !ok {
		t.Skip("this store keeps no payloads")
	}
	ctx := context.Background()
	begin(t, s, "t-pay", "", "go")
	big := bytes.Repeat([]byte{0, 0xff, 'x'}, 1<<20) // 3 MiB, NUL and invalid UTF-8 included
	if err := p.PutPayloads(ctx, "t-pay", map[string][]byte{"m/00000002": []byte("two"), "m/00000010": big, "input": []byte("in")}); err != nil {
		t.Fatal(err)
	}
	if err := p.PutPayloads(ctx, "t-pay", map[string][]byte{"m/00000002": []byte("TWO"), "m/00000001": []byte("one")}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var vals [][]byte
	if err := p.PayloadRange(ctx, "t-pay", "m/", func(k string, v []byte) error {
		keys, vals = append(keys, k), append(vals, bytes.Clone(v)) // v is lent for the call
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"m/00000001", "m/00000002", "m/00000010"}; !slices.Equal(keys, want) {
		t.Fatalf("range m/ has keys %q, want %q", keys, want)
	}
	if string(vals[1]) != "TWO" || !bytes.Equal(vals[2], big) {
		t.Errorf("range values: %q, %d bytes (want TWO, the 3 MiB value)", vals[1], len(vals[2]))
	}
	stop := errors.New("enough")
	calls := 0
	if err := p.PayloadRange(ctx, "t-pay", "m/", func(string, []byte) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Errorf("a range whose function fails: %v after %d calls, want its error after 1", err, calls)
	}
	var v []byte
	if err := p.Payload(ctx, "t-pay", "m/00000010", func(data []byte) error { v = bytes.Clone(data); return nil }); err != nil || !bytes.Equal(v, big) {
		t.Errorf("Payload(m/00000010) = %d bytes, %v (want the 3 MiB value)", len(v), err)
	}
	if err := p.Payload(ctx, "t-pay", "input", func(data []byte) error { v = bytes.Clone(data); return nil }); err != nil || string(v) != "in" {
		t.Errorf("Payload(input) = %q, %v", v, err)
	}
	if err := p.Payload(ctx, "t-pay", "nope", func([]byte) error { t.Error("called for a missing payload"); return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a missing payload: %v, want ErrNotFound", err)
	}
	if err := p.Payload(ctx, "t-pay", "input", func([]byte) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("a payload whose function fails: %v, want its error", err)
	}
	n := 0
	if err := p.PayloadRange(ctx, "t-other", "m/", func(string, []byte) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("another turn's range: %d values, %v", n, err)
	}
}

// testTurnWithoutResults checks store.Payloads.TurnWithoutResults, for
// the stores that keep payloads: a running turn and an ended one, as Turn
// reads them, each tool call's result left out.
func testTurnWithoutResults(t *testing.T, s store.Store) {
	p, ok := s.(store.Payloads)
	if !ok {
		t.Skip("this store keeps no payloads")
	}
	ctx := context.Background()
	tr := begin(t, s, "t-calls", "", "go")
	tr.model(1, "two calls")
	tr.tool(1, 1, event.OutcomeOK)
	big := tr.tool(1, 2, event.OutcomeOK)
	big.Result = strings.Repeat("r\u0000é", 100_000) // 1 MB, a JSON escape and UTF-8 among it
	tr.tools[1] = big
	if err := s.UpdateToolCall(ctx, big); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		want, err := s.Turn(ctx, "t-calls")
		if err != nil {
			t.Fatal(err)
		}
		if len(want.ToolCalls) != 2 || want.ToolCalls[1].Result != big.Result {
			t.Fatalf("%s: Turn lists %d calls, the second's result %d bytes; want 2, %d", when, len(want.ToolCalls), len(want.ToolCalls[1].Result), len(big.Result))
		}
		for i := range want.ToolCalls {
			want.ToolCalls[i].Result = ""
		}
		got, err := p.TurnWithoutResults(ctx, "t-calls")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: (-Turn's without results +TurnWithoutResults):\n%s", when, diff)
		}
	}
	check("running")
	tr.finish(t, budget.Answered)
	check("ended")
	if _, err := p.TurnWithoutResults(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an unknown turn: %v, want ErrNotFound", err)
	}
}

// testNumberedEnds: among events the store numbers (seq 0), a second
// tool_finished for one call, llm_finished for one attempt,
// compaction_finished for one compaction, or turn_finished is refused
// with ErrExists and not stored — a unit taken for lost, and recorded so,
// that finishes after all leaves one record.
func testNumberedEnds(t *testing.T, s store.Store) {
	ctx := context.Background()
	begin(t, s, "t-ends", "", "go")
	at := clock
	ev := func(p event.Payload) event.Event {
		at = at.Add(time.Millisecond)
		return event.Event{TurnID: "t-ends", Type: p.Type(), At: at, Data: p}
	}
	if err := s.AppendEvent(ctx, ev(&event.LLMStarted{Step: 1, Model: "m", Attempt: 1})); err != nil {
		if strings.Contains(err.Error(), "seq") {
			t.Skip("this store numbers no events: ", err)
		}
		t.Fatal(err)
	}
	tool := func(outcome event.Outcome) event.Event {
		return ev(&event.ToolFinished{ToolCall: event.ToolCall{CallID: "call_1_1", Tool: "x", Outcome: outcome, StartedAt: at}})
	}
	// A compaction of step 2 recorded lost with its worker (interrupted,
	// worker_lost), then finished by that worker, slow, not dead.
	compaction := func(attempt int, outcome event.Outcome) event.Event {
		return ev(&event.CompactionFinished{Step: 2, Outcome: outcome, Record: &event.ModelCall{Step: 2, Attempt: attempt,
			Compaction: true, Outcome: outcome, StartedAt: at}})
	}
	for _, tc := range []struct {
		name          string
		first, second event.Event
	}{
		{"tool_finished", tool(event.OutcomeOK), tool(event.OutcomeInterrupted)},
		{"llm_finished", ev(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Attempt: 1, Outcome: event.OutcomeOK}}),
			ev(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Attempt: 1, Outcome: event.OutcomeInterrupted}})},
		{"compaction_finished", compaction(1, event.OutcomeInterrupted), compaction(1, event.OutcomeOK)},
		{"turn_finished", ev(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered}),
			ev(&event.TurnFinished{Status: budget.StatusInterrupted, StopReason: budget.EngineLost})},
	} {
		if err := s.AppendEvent(ctx, tc.first); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := s.AppendEvent(ctx, tc.second); !errors.Is(err, store.ErrExists) {
			t.Errorf("a second %s: %v, want ErrExists", tc.name, err)
		}
	}
	if err := s.AppendEvent(ctx, ev(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Attempt: 2, Outcome: event.OutcomeOK}})); err != nil {
		t.Errorf("another attempt's llm_finished: %v", err)
	}
	if err := s.AppendEvent(ctx, compaction(2, event.OutcomeOK)); err != nil {
		t.Errorf("the compaction tried again: %v", err)
	}
	evs, err := s.Events(ctx, "t-ends", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Type != event.TypeTurnStarted {
			n++
		}
	}
	if n != 7 {
		for _, e := range evs {
			t.Logf("%d %s", e.Seq, e.Type)
		}
		t.Errorf("%d events stored after turn_started, want 7 (llm_started and one end of each, and the second attempt's and compaction's)", n)
	}
	rec, err := s.Turn(ctx, "t-ends")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeOK {
		t.Errorf("tool call records: %+v, want the first one only", rec.ToolCalls)
	}
	var compactions []string
	for _, mc := range rec.ModelCalls {
		if mc.Compaction {
			compactions = append(compactions, fmt.Sprintf("attempt %d %s", mc.Attempt, mc.Outcome))
		}
	}
	if want := []string{"attempt 1 interrupted", "attempt 2 ok"}; !slices.Equal(compactions, want) {
		t.Errorf("compaction records: %v, want %v", compactions, want)
	}
}

// testApprovals: the first decision on a call wins, whoever makes it (a
// person, the turn's expiry); a decision after the wait's end is an
// expiry; rounds ask again; the turn's watchers hear of a decision.
func testApprovals(t *testing.T, s store.Store) {
	as, ok := s.(store.Approvals)
	if !ok {
		t.Fatal("the store keeps no approvals")
	}
	ctx := t.Context()
	begin(t, s, "t_appr", "", "deploy")
	at := clock.Add(time.Minute)
	req := store.Approval{TurnID: "t_appr", CallID: "call_1_1", Round: 1, Tool: "deploy", Arguments: []byte(`{"env":"prod"}`),
		RequestedAt: at, ExpiresAt: at.Add(time.Hour)}
	if err := as.RequestApproval(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := as.RequestApproval(ctx, req); err != nil {
		t.Fatalf("asking twice: %v", err)
	}
	two := req
	two.CallID = "call_1_2"
	if err := as.RequestApproval(ctx, two); err != nil {
		t.Fatal(err)
	}
	if _, err := as.Decide(ctx, "t_appr", "call_9_9", store.Approval{Decision: event.Approve, DecidedAt: at}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deciding an unknown call: %v", err)
	}
	changed, unwatch := s.Watch("t_appr")
	defer unwatch()
	// An expiry before the wait's end is refused.
	if a, err := as.Decide(ctx, "t_appr", "call_1_1", store.Approval{Decision: event.Expired, DecidedAt: at.Add(time.Minute)}); err == nil || a.Decision != "" {
		t.Fatalf("early expiry: %+v, %v", a, err)
	}
	a, err := as.Decide(ctx, "t_appr", "call_1_1", store.Approval{Decision: event.Approve, By: "alice", Reason: "ok", DecidedAt: at.Add(2 * time.Minute)})
	if err != nil || a.Decision != event.Approve || a.By != "alice" || !a.DecidedAt.Equal(at.Add(2*time.Minute)) {
		t.Fatalf("decide: %+v, %v", a, err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the turn's watchers did not hear of the decision")
	}
	// The second decision, and the turn's expiry after it, find the first.
	a, err = as.Decide(ctx, "t_appr", "call_1_1", store.Approval{Decision: event.Deny, By: "bob", DecidedAt: at.Add(3 * time.Minute)})
	if !errors.Is(err, store.ErrDecided) || a.Decision != event.Approve || a.By != "alice" {
		t.Fatalf("second decision: %+v, %v", a, err)
	}
	if a, err = as.Decide(ctx, "t_appr", "call_1_1", store.Approval{Decision: event.Expired, DecidedAt: at.Add(2 * time.Hour)}); !errors.Is(err, store.ErrDecided) || a.Decision != event.Approve {
		t.Fatalf("expiry after a decision: %+v, %v", a, err)
	}
	// A decision after the wait's end finds it expired, and stores that.
	a, err = as.Decide(ctx, "t_appr", "call_1_2", store.Approval{Decision: event.Approve, By: "carol", DecidedAt: at.Add(2 * time.Hour)})
	if !errors.Is(err, store.ErrDecided) || a.Decision != event.Expired {
		t.Fatalf("late decision: %+v, %v", a, err)
	}
	if a, err = as.Approval(ctx, "t_appr", "call_1_2"); err != nil || a.Decision != event.Expired || !a.DecidedAt.Equal(req.ExpiresAt) {
		t.Fatalf("after a late decision: %+v, %v", a, err)
	}
	// A second round asks again; the route decides the last.
	again := req
	again.Round, again.RequestedAt, again.ExpiresAt = 2, at.Add(time.Hour), at.Add(3*time.Hour)
	if err := as.RequestApproval(ctx, again); err != nil {
		t.Fatal(err)
	}
	if a, err = as.Decide(ctx, "t_appr", "call_1_1", store.Approval{Decision: event.Deny, By: "dave", Reason: "no", DecidedAt: at.Add(90 * time.Minute)}); err != nil || a.Round != 2 {
		t.Fatalf("second round: %+v, %v", a, err)
	}
	list, err := as.Approvals(ctx, "t_appr")
	if err != nil || len(list) != 2 || list[1].CallID != "call_1_1" || list[1].Round != 2 || list[1].Decision != event.Deny ||
		list[0].CallID != "call_1_2" || string(list[0].Arguments) != `{"env":"prod"}` || list[0].Tool != "deploy" {
		t.Fatalf("approvals: %+v, %v", list, err)
	}
	if _, err := as.Approval(ctx, "t_appr", "call_7_7"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown call: %v", err)
	}
}

// testSuspended: a suspended turn stays running, owned by nobody, with its
// checkpoint, until one store resumes it; then it ends as any turn.
func testSuspended(t *testing.T, s store.Store) {
	sp, ok := s.(store.Suspender)
	if !ok {
		t.Fatal("the store keeps no suspended turns")
	}
	ctx := t.Context()
	tr := begin(t, s, "t_susp", "s_susp", "deploy")
	tr.model(1, "asking")
	if err := sp.SuspendTurn(ctx, "t_susp", []byte(`{"state": 1}`)); err != nil {
		t.Fatal(err)
	}
	if ids, err := sp.SuspendedTurns(ctx); err != nil || len(ids) != 1 || ids[0] != "t_susp" {
		t.Fatalf("suspended turns: %v, %v", ids, err)
	}
	if rec, err := s.Turn(ctx, "t_susp"); err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("a suspended turn: %+v, %v", rec, err)
	}
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t_other", SessionID: "s_susp", Input: "x", StartedAt: clock}); !errors.Is(err, store.ErrSessionBusy) {
		t.Fatalf("a second turn in the suspended turn's session: %v", err)
	}
	cp, err := sp.ResumeTurn(ctx, "t_susp")
	if err != nil || string(cp) != `{"state": 1}` {
		t.Fatalf("resume: %q, %v", cp, err)
	}
	if _, err := sp.ResumeTurn(ctx, "t_susp"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("resumed twice: %v", err)
	}
	if ids, _ := sp.SuspendedTurns(ctx); len(ids) != 0 {
		t.Fatalf("still suspended: %v", ids)
	}
	if rec := tr.finish(t, budget.Answered); rec.Status != budget.StatusCompleted {
		t.Fatalf("the resumed turn ended %s", rec.Status)
	}
	if err := sp.SuspendTurn(ctx, "t_susp", []byte(`{}`)); !errors.Is(err, store.ErrNotRunning) {
		t.Fatalf("suspending an ended turn: %v", err)
	}
}
