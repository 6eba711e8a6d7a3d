package event_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

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

// TestRecordsCarryEveryFieldOfTheSpec: the tool call and model call
// records have every field the spec's §8 lists, even on the call that
// succeeded (an empty phase, stderr_tail or error), so that a reader can
// rely on the keys.
func TestRecordsCarryEveryFieldOfTheSpec(t *testing.T) {
	for _, c := range []struct {
		rec  any
		keys string
	}{
		{event.ToolCall{CallID: "c", Tool: "x", Outcome: event.OutcomeOK}, "call_id, turn_id, tool, kind, arguments, started_at, " +
			"ended_at, duration_ms, timeout_ms, timeout_source, idle_timeout_ms, enforcement, outcome, " +
			"phase, overran, abandoned, late_result, progress_count, exit_code, stderr_tail, result, truncated"},
		{event.ModelCall{Model: "m", Outcome: event.OutcomeOK}, "model, provider, profile, attempt, first_chunk_ms, stream_ms, outcome, phase, error"},
	} {
		b, err := json.Marshal(c.rec)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		for _, k := range strings.Split(c.keys, ", ") {
			if _, ok := got[k]; !ok {
				t.Errorf("%T lacks %s: %s", c.rec, k, b)
			}
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

// long is a text of over longjson.Long bytes, which Marshal, WriteJSON
// and WriteTurn write apart, with what escapes differently.
var long = strings.Repeat("<b>&\u2028 \"x\"</b> é 😀 \n\t\x01\xff ", 10000)

// events are events to marshal: short and long texts in every field
// written apart.
func events() []event.Event {
	at := time.Date(2026, 11, 26, 18, 0, 0, 0, time.UTC)
	return []event.Event{
		{Seq: 3, TurnID: "t", Type: event.TypeLLMDelta, Data: &event.LLMDelta{Step: 1, Text: "<b>&\u2028 \"x\"</b>"}},
		{Seq: 4, TurnID: "t", Type: event.TypeTurnFinished, Data: &event.TurnFinished{Answer: "a < b"}},
		{Seq: 5, Type: "future", Data: json.RawMessage(`{"seq": 5, "type": "future"}`)},
		{Seq: 6, TurnID: "t", Type: event.TypeLLMDelta},
		{Seq: 7, TurnID: "t", Type: event.TypeLLMDelta, At: at, Data: &event.LLMDelta{Step: 2, Text: long}},
		{Seq: 8, TurnID: "t", Type: event.TypeTurnFinished, At: at, Data: &event.TurnFinished{Status: budget.StatusCompleted,
			Message: `"answer":""`, Answer: long, Limit: &event.BudgetValue{Key: "max_reply"}}},
		{Seq: 9, TurnID: "t", Type: event.TypeToolFinished, At: at, Data: &event.ToolFinished{
			ToolCall: event.ToolCall{CallID: "c", Result: long, Arguments: json.RawMessage(`{"q":"\"result\":\"\""}`)}}},
		{Seq: 10, TurnID: "t", Type: event.TypeLateResult, At: at, Data: &event.LateResult{CallID: "c", Output: long}},
		// An answer's message is the answer.
		{Seq: 12, TurnID: "t", Type: event.TypeTurnFinished, At: at, Data: &event.TurnFinished{Status: budget.StatusCompleted,
			Message: long, Answer: long}},
		// A field of the same name inside: marshalled whole.
		{Seq: 11, TurnID: "t", Type: event.TypeToolFinished, At: at, Data: &event.ToolFinished{
			ToolCall: event.ToolCall{CallID: "c", Result: long, Arguments: json.RawMessage(`{"result":""}`)}}},
	}
}

// TestMarshalIsJSONMarshal: event.Marshal returns what json.Marshal does,
// and WriteJSON writes it; a long text is marshalled into a buffer of the
// exact length.
func TestMarshalIsJSONMarshal(t *testing.T) {
	for _, e := range events() {
		want, werr := json.Marshal(e)
		got, err := event.Marshal(e)
		if string(got) != string(want) || (err == nil) != (werr == nil) {
			t.Errorf("%d %s: Marshal %.200s (%v), json.Marshal %.200s (%v)", e.Seq, e.Type, got, err, want, werr)
		}
		if len(want) > len(long) && e.Seq != 11 && cap(got) != len(got) {
			t.Errorf("%d %s: Marshal's buffer holds %d bytes for %d", e.Seq, e.Type, cap(got), len(got))
		}
		var w strings.Builder
		if err := event.WriteJSON(&w, e); err != nil || w.String() != string(want) {
			t.Errorf("%d %s: WriteJSON %.200s (%v), json.Marshal %.200s", e.Seq, e.Type, w.String(), err, want)
		}
		d, err := event.MarshalDoc(e)
		var b bytes.Buffer
		if err == nil {
			_, err = d.WriteTo(&b)
		}
		if err != nil || b.String() != string(want) {
			t.Errorf("%d %s: MarshalDoc %.200s (%v), json.Marshal %.200s", e.Seq, e.Type, b.String(), err, want)
		}
		// A long text stays the event's own, not escaped ahead.
		if _, whole := d.Raw(); whole == (len(want) > len(long) && e.Seq != 11) {
			t.Errorf("%d %s: MarshalDoc whole: %v", e.Seq, e.Type, whole)
		}
	}
}

// TestWriteTurnIsJSONMarshal: MarshalTurn and WriteTurn write a record as
// json.Marshal does, with and without events, its answer long or short.
func TestWriteTurnIsJSONMarshal(t *testing.T) {
	for _, rec := range []*event.Turn{
		{TurnID: "t", Answer: "short <b>", Input: "hi", ToolCalls: []event.ToolCall{{CallID: "c"}}},
		{TurnID: "t", Answer: long, Message: `"answer":""`, Events: events()},
		{TurnID: "t", Answer: long, ModelCalls: []event.ModelCall{{Step: 1}}},
		{TurnID: "t", Answer: long, Message: long, Input: `"message":""`},
		{TurnID: "t", Answer: "", Events: events()[:1]},
	} {
		want, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := event.MarshalTurn(rec)
		if err != nil || string(got) != string(want) {
			t.Errorf("MarshalTurn %.200s (%v), json.Marshal %.200s", got, err, want)
		}
		if len(rec.Events) == 0 && cap(got) != len(got) {
			t.Errorf("MarshalTurn's buffer holds %d bytes for %d", cap(got), len(got))
		}
		var w strings.Builder
		if err := event.WriteTurn(&w, rec); err != nil || w.String() != string(want) {
			t.Errorf("WriteTurn %.200s (%v), json.Marshal %.200s", w.String(), err, want)
		}
	}
}

// TestShareReply: the log's deltas of a step become pieces of the joined
// reply, their texts unchanged; what the sinks were given stays theirs;
// a delta that is not the reply's next piece, and those after it, keep
// their own strings.
func TestShareReply(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		shared      int
	}{
		{"whole", "abcdef", 3},
		{"differs after two", "abcdXf", 2},
		{"shorter", "ab", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []event.Event
			keeper := &replyKeeper{}
			em := event.NewEmitter("t", event.SinkFunc(func(e event.Event) { got = append(got, e) }), keeper)
			start := em.Emit(&event.LLMStarted{Step: 1})
			for _, s := range []string{"ab", "cd"} {
				em.Emit(&event.LLMDelta{Step: 1, Text: s})
			}
			em.Emit(&event.StillWorking{Step: 1})
			em.Emit(&event.LLMDelta{Step: 1, Text: "ef"})
			em.ShareReply(start.Seq, 1, tc.reply)
			shared := 0
			for i, e := range em.Log() {
				if !reflect.DeepEqual(e, got[i]) {
					t.Errorf("event %d: log %+v, sink had %+v", e.Seq, e.Data, got[i].Data)
				}
				d, ok := e.Data.(*event.LLMDelta)
				if !ok {
					continue
				}
				if d != got[i].Data.(*event.LLMDelta) {
					shared++
					if unsafe.StringData(d.Text) != unsafe.StringData(tc.reply[strings.Index(tc.reply, d.Text):]) {
						t.Errorf("event %d: %q is not a piece of the reply", e.Seq, d.Text)
					}
				}
			}
			if shared != tc.shared {
				t.Errorf("%d deltas share the reply, want %d", shared, tc.shared)
			}
			// A sink that keeps events is given the new deltas to keep.
			if len(keeper.shared) != tc.shared {
				t.Fatalf("the ReplySharer was given %d deltas, want %d", len(keeper.shared), tc.shared)
			}
			log := em.Log()
			for _, e := range keeper.shared {
				if e.Data != log[e.Seq-1].Data {
					t.Errorf("event %d: the ReplySharer was given %+v, not the log's %+v", e.Seq, e.Data, log[e.Seq-1].Data)
				}
			}
		})
	}
}

// replyKeeper is a sink that keeps events, as an in-memory store does.
type replyKeeper struct{ shared []event.Event }

func (*replyKeeper) Emit(event.Event) {}

func (k *replyKeeper) ShareReply(deltas []event.Event) { k.shared = append(k.shared, deltas...) }

// TestNilSinksAreSkipped: a nil Sink, or a nil SinkFunc, given among a
// run's sinks is skipped; the others get every event.
func TestNilSinksAreSkipped(t *testing.T) {
	var got []event.Event
	var nilFunc event.SinkFunc
	em := event.NewEmitter("t", nil, nilFunc, event.SinkFunc(func(e event.Event) { got = append(got, e) }))
	em.Emit(&event.StillWorking{Subject: "x"})
	if len(got) != 1 {
		t.Fatalf("got %d events", len(got))
	}
}
