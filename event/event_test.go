package event_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

func TestEventJSONIsFlatAndRoundTrips(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	p, total := 3.0, 10.0
	code := 2
	cases := []any{
		&event.ToolStarted{Step: 1, CallID: "call_1_1", Tool: "crawl", Kind: "exec", TimeoutMS: 600000,
			Deadline: at.Add(10 * time.Minute), Enforcement: "hard", Source: budget.ProfileSource("slow")},
		&event.ToolProgress{CallID: "call_1_1", Tool: "crawl", Progress: &p, Total: &total, Message: "page 3"},
		&event.ToolFinished{ToolCall: event.ToolCall{CallID: "call_1_1", TurnID: "t_1", Tool: "crawl", Outcome: event.OutcomeTimedOut,
			Phase: budget.PhaseTool, ExitCode: &code, Arguments: json.RawMessage(`{"url":"x"}`), Result: "{}"}},
		&event.TurnFinished{Status: budget.StatusStopped, StopReason: budget.TurnTimeout, Message: "m",
			Flags: event.Flags{TimedOutByTurnBudget: true}, Totals: event.Totals{Steps: 2}},
		&event.LLMFinished{ModelCall: event.ModelCall{Model: "m", Outcome: event.OutcomeOK}, ToolCalls: 1},
	}
	for _, d := range cases {
		e := event.Event{Seq: 7, TurnID: "t_1", Type: event.TypeOf(d), At: at, Data: d}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var flat map[string]any
		if err := json.Unmarshal(b, &flat); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if flat["seq"] != 7.0 || flat["turn_id"] != "t_1" || flat["type"] != string(e.Type) || flat["at"] != "2026-11-22T10:00:00.123456789Z" {
			t.Fatalf("header of %s", b)
		}
		if strings.Count(string(b), `"turn_id"`) != 1 {
			t.Fatalf("turn_id twice in %s", b)
		}
		var back event.Event
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back.Data, d) || back.Seq != 7 || !back.At.Equal(at) {
			t.Fatalf("round trip of %s:\n got %#v\nwant %#v", b, back.Data, d)
		}
	}
}

func TestToolStartedFields(t *testing.T) {
	b, _ := json.Marshal(event.Event{Type: event.TypeToolStarted, Data: &event.ToolStarted{CallID: "c", Tool: "x", TimeoutMS: 1000,
		Enforcement: "hard", Source: budget.SourceFlag}})
	for _, k := range []string{"call_id", "tool", "timeout_ms", "deadline", "enforcement", "source"} {
		if !strings.Contains(string(b), `"`+k+`":`) {
			t.Errorf("tool_started lacks %s: %s", k, b)
		}
	}
}

func TestEmitterOrdersConcurrentEmits(t *testing.T) {
	var mu sync.Mutex
	var seqs []int64
	em := event.NewEmitter("t", event.SinkFunc(func(e event.Event) {
		mu.Lock()
		seqs = append(seqs, e.Seq)
		mu.Unlock()
	}))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				em.Emit(&event.ToolProgress{CallID: "c"})
			}
		})
	}
	wg.Wait()
	em.Close()
	if e := em.Emit(&event.ToolProgress{}); e.Seq != 0 {
		t.Fatal("emit after close was delivered")
	}
	if len(seqs) != 800 {
		t.Fatalf("%d events", len(seqs))
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("sink saw seq %d at %d", s, i)
		}
	}
	if len(em.Log()) != 800 {
		t.Fatal("log incomplete")
	}
}

func TestUnknownTypeIsKept(t *testing.T) {
	var e event.Event
	if err := json.Unmarshal([]byte(`{"seq":1,"turn_id":"t","type":"future_thing","at":"2026-11-22T10:00:00Z","x":1}`), &e); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Data.(json.RawMessage); !ok || e.Type != "future_thing" {
		t.Fatalf("got %#v", e)
	}
	b, err := json.Marshal(e)
	if err != nil || strings.Count(string(b), `"seq"`) != 1 || !strings.Contains(string(b), `"x":1`) {
		t.Fatalf("re-encoded as %s (%v)", b, err)
	}
}

func TestTotalsCountRefusedCallsApart(t *testing.T) {
	tr := event.Turn{Steps: 2, ToolCalls: []event.ToolCall{
		{Outcome: event.OutcomeOK}, {Outcome: event.OutcomeTimedOut},
		{Outcome: event.OutcomeError, Refused: "unknown_tool"}, {Outcome: event.OutcomeCancelled, Refused: "cancelled"},
	}}
	got := tr.Totals()
	if got.ToolCalls != 2 || got.ToolCallsRefused != 2 {
		t.Fatalf("totals %+v: want 2 that ran, 2 refused", got)
	}
	b, _ := json.Marshal(got)
	if !strings.Contains(string(b), `"tool_calls":2,"tool_calls_refused":2`) {
		t.Fatalf("JSON %s", b)
	}
}

// TestMarshalIsJSONMarshal: event.Marshal returns what json.Marshal does.
func TestMarshalIsJSONMarshal(t *testing.T) {
	for _, e := range []event.Event{
		{Seq: 3, TurnID: "t", Type: event.TypeLLMDelta, Data: &event.LLMDelta{Step: 1, Text: "<b>&\u2028 \"x\"</b>"}},
		{Seq: 4, TurnID: "t", Type: event.TypeTurnFinished, Data: &event.TurnFinished{Answer: "a < b"}},
		{Seq: 5, Type: "future", Data: json.RawMessage(`{"seq": 5, "type": "future"}`)},
		{Seq: 6, TurnID: "t", Type: event.TypeLLMDelta},
	} {
		want, werr := json.Marshal(e)
		got, err := event.Marshal(e)
		if string(got) != string(want) || (err == nil) != (werr == nil) {
			t.Errorf("%s: Marshal %s (%v), json.Marshal %s (%v)", e.Type, got, err, want, werr)
		}
	}
}
