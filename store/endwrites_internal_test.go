package store

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
)

// full returns a record with every field set, pointers too.
func full() event.ToolCall {
	code := 3
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	return event.ToolCall{CallID: "call_1_1", TurnID: "t1", Step: 1, Tool: "sh", Kind: "exec", Arguments: json.RawMessage(`{"a":1}`),
		StartedAt: at, EndedAt: at.Add(time.Second), DurationMS: 1000, TimeoutMS: 2000, TimeoutSource: "tool", IdleTimeoutMS: 500,
		Enforcement: "kill", Outcome: event.OutcomeAbandoned, Refused: "limit", Phase: "tool", Overran: true, Abandoned: true,
		LateResult: true, ProgressCount: 2, ExitCode: &code, StderrTail: "err", Result: "out", Truncated: true, LateOutput: "late",
		ServerRestarted: true, NoticedAt: at.Add(2 * time.Second), ApprovalMS: 7, Approval: &event.Approval{Decision: "approved", By: "ann", Reason: "ok"}}
}

// change sets v to a value other than its own.
func change(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	if tm, ok := v.Interface().(time.Time); ok {
		v.Set(reflect.ValueOf(tm.Add(time.Nanosecond)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Slice:
		v.SetBytes(append(append([]byte(nil), v.Bytes()...), ' '))
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		p.Elem().Set(v.Elem())
		change(t, name, p.Elem())
		v.Set(p)
	case reflect.Struct:
		change(t, name+"."+v.Type().Field(0).Name, v.Field(0))
	default:
		t.Fatalf("field %s is a %s: teach change how to change it", name, v.Kind())
	}
}

// TestSameToolCallSeesEveryField fails when a field of event.ToolCall is
// added and sameToolCall does not compare it: the end would then leave a
// record stored without the change.
func TestSameToolCallSeesEveryField(t *testing.T) {
	a := full()
	typ := reflect.TypeFor[event.ToolCall]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		b := full()
		change(t, f.Name, reflect.ValueOf(&b).Elem().Field(i))
		if got, want := sameToolCall(&a, &b), f.Name == "TurnID"; got != want {
			t.Errorf("a record whose %s changed: sameToolCall = %v, want %v", f.Name, got, want)
		}
	}
	b := full() // pointers to equal values
	if !sameToolCall(&a, &b) {
		t.Error("two records with equal values are not the same")
	}
	b.ExitCode, b.Approval = nil, nil
	if sameToolCall(&a, &b) {
		t.Error("a record without an exit code or approval is the same as one with")
	}
	b = full()
	b.Arguments = nil
	a.Arguments = json.RawMessage{}
	if sameToolCall(&a, &b) {
		t.Error("arguments null and empty are the same")
	}
}

func TestEndOf(t *testing.T) {
	em := event.NewEmitter("t1")
	em.Emit(&event.TurnStarted{Input: "x"})
	m1 := event.ModelCall{Step: 1, Model: "m", Outcome: event.OutcomeOK}
	em.Emit(&event.LLMFinished{ModelCall: m1})
	var tools []event.ToolCall
	for _, id := range []string{"call_1_1", "call_1_2", "call_1_3"} {
		tc := full()
		tc.CallID = id
		tools = append(tools, tc)
		em.Emit(&event.ToolFinished{ToolCall: tc})
	}
	m2 := event.ModelCall{Step: 2, Model: "m", Outcome: event.OutcomeOK}
	em.Emit(&event.CompactionFinished{Step: 2, Record: &m2})
	em.Emit(&event.TurnFinished{})
	em.Close()
	log := em.Log()
	all := []int64{1, 2, 3, 4, 5, 6, 7}
	rec := func() *event.Turn {
		return &event.Turn{TurnID: "t1", Events: log, ToolCalls: append([]event.ToolCall(nil), tools...), ModelCalls: []event.ModelCall{m1, m2}}
	}
	ids := func(tcs []event.ToolCall) (s []string) {
		for _, tc := range tcs {
			s = append(s, tc.CallID)
		}
		return s
	}

	t.Run("nothing changed", func(t *testing.T) {
		w := EndOf(rec(), all)
		if len(w.Events) != 0 || len(w.ToolCalls) != 0 || w.ModelCalls {
			t.Fatalf("%d events, calls %v, model calls %v: want nothing", len(w.Events), ids(w.ToolCalls), w.ModelCalls)
		}
	})
	t.Run("a late result", func(t *testing.T) {
		r := rec()
		r.ToolCalls[1].LateOutput = "came late"
		r.ToolCalls[2].TurnID = "" // not a change: stored under the event's turn
		if w := EndOf(r, all); len(w.ToolCalls) != 1 || w.ToolCalls[0].LateOutput != "came late" || w.ModelCalls {
			t.Fatalf("calls %v, model calls %v: want call_1_2 alone", ids(w.ToolCalls), w.ModelCalls)
		}
	})
	t.Run("a call no event carried", func(t *testing.T) {
		r := rec()
		extra := full()
		extra.CallID = "call_2_1"
		r.ToolCalls = append(r.ToolCalls, extra)
		if w := EndOf(r, all); len(w.ToolCalls) != 1 || w.ToolCalls[0].CallID != "call_2_1" {
			t.Fatalf("calls %v: want call_2_1", ids(w.ToolCalls))
		}
	})
	t.Run("an event the store lacks", func(t *testing.T) {
		w := EndOf(rec(), []int64{1, 2, 3, 5, 6, 7})
		if len(w.Events) != 1 || w.Events[0].Seq != 4 || len(w.ToolCalls) != 3 || !w.ModelCalls {
			t.Fatalf("%d events, calls %v, model calls %v: want seq 4, every record", len(w.Events), ids(w.ToolCalls), w.ModelCalls)
		}
	})
	t.Run("no events", func(t *testing.T) {
		r := rec()
		r.Events = nil
		if w := EndOf(r, nil); len(w.ToolCalls) != 3 || !w.ModelCalls {
			t.Fatalf("calls %v, model calls %v: want every record", ids(w.ToolCalls), w.ModelCalls)
		}
	})
	for name, models := range map[string][]event.ModelCall{
		"a model call changed":  {m1, {Step: 2, Model: "m", Outcome: event.OutcomeOK, OutputTokens: 1}},
		"model calls reordered": {m2, m1},
		"a model call no event": {m1, m2, m1},
		"a model call left out": {m1},
	} {
		t.Run(name, func(t *testing.T) {
			r := rec()
			r.ModelCalls = models
			if w := EndOf(r, all); !w.ModelCalls || len(w.ToolCalls) != 0 {
				t.Fatalf("calls %v, model calls %v: want the model calls alone", ids(w.ToolCalls), w.ModelCalls)
			}
		})
	}
}
