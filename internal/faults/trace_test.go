//go:build faults && linux

package faults

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// traced is the environment that makes a timebox process export its spans
// to recv, each batch 50 ms after its first span ended (5 s by default),
// so that a process killed later has exported the spans of what ended
// before.
func traced(recv *testenv.OTLP) []string {
	return []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + recv.URL + "/v1/traces",
		"OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_BSP_SCHEDULE_DELAY=50"}
}

// traceWhole asserts that the trace recv received is whole, however the
// processes that made it died: every span's parent is another span recv
// received, of the same trace, or the caller's span (the traceparent the
// turns were started under; "" for none, when a turn's span is a root),
// and each turn — those named, and any an invoke_agent span names — has
// exactly one invoke_agent span. A span that died unexported with a
// killed process is no fault; a span whose parent never arrives, or a
// turn without its root, is: a collector shows that trace as broken.
// Spans arrive after the processes that end them, so it waits up to 10 s
// for the trace to be whole before it measures. It reports whether it was.
func (s *scenario) traceWhole(recv *testenv.OTLP, caller string, turns ...string) bool {
	s.t.Helper()
	callerSpan := ""
	if parts := strings.Split(caller, "-"); len(parts) == 4 {
		callerSpan = parts[2]
	}
	var orphans, miscounted, spans, roots int
	var said []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := recv.Spans()
		orphans, miscounted, spans, roots, said = wholeness(got, callerSpan, turns)
		if orphans+miscounted == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, line := range said {
		s.t.Log(line)
	}
	s.truth("the trace: spans whose parent never arrived; turns with ≠1 invoke_agent span", "0; 0",
		fmt.Sprintf("%d of %d; %d of %d", orphans, spans, miscounted, roots), orphans+miscounted == 0 && spans > 0)
	return orphans+miscounted == 0 && spans > 0
}

// wholeness counts, of spans, those whose parent is neither among them
// (in the same trace) nor callerSpan (hex), and the turns without exactly
// one invoke_agent span; it says what it counted.
func wholeness(spans []*tracepb.Span, callerSpan string, turns []string) (orphans, miscounted, total, roots int, said []string) {
	byID := map[string]*tracepb.Span{}
	for _, sp := range spans {
		byID[string(sp.GetSpanId())] = sp
	}
	count := map[string]int{}
	for _, id := range turns {
		count[id] = 0
	}
	for _, sp := range spans {
		isTurn := strings.HasPrefix(sp.GetName(), "invoke_agent ")
		if isTurn {
			count[testenv.SpanAttrs(sp)["timebox.turn.id"].GetStringValue()]++
		}
		parent := sp.GetParentSpanId()
		switch p, ok := byID[string(parent)]; {
		case len(parent) == 0 && isTurn && callerSpan == "":
		case hex.EncodeToString(parent) == callerSpan && callerSpan != "" && isTurn:
		case ok && string(p.GetTraceId()) == string(sp.GetTraceId()):
		default:
			orphans++
			said = append(said, fmt.Sprintf("span %q (%x) names parent %x, which never arrived", sp.GetName(), sp.GetSpanId(), parent))
		}
	}
	for id, n := range count {
		if n != 1 {
			miscounted++
			said = append(said, fmt.Sprintf("turn %s has %d invoke_agent spans", id, n))
		}
	}
	return orphans, miscounted, len(spans), len(count), said
}

// callSpans asserts that each tool call of events whose tool_started
// named its span (traceparent) has exactly one execute_tool span with
// those ids in recv: the span its process ended, or, for a call running
// when its process died, the one whoever ended the turn made
// (docs/decisions/turn-span-of-a-lost-turn.md). Spans arrive after the
// processes that end them, so it waits up to 10 s. It reports whether
// they had.
func (s *scenario) callSpans(recv *testenv.OTLP, events []event.Event) bool {
	s.t.Helper()
	return s.namedSpans(recv, events, "the calls' execute_tool spans, once each with the ids tool_started named", "execute_tool ",
		func(e event.Event) (string, string, bool) {
			d, ok := e.Data.(*event.ToolStarted)
			if !ok {
				return "", "", false
			}
			return "call " + d.CallID, d.Traceparent, true
		})
}

// chatSpans is callSpans for the model call attempts: each llm_started
// that named its span has exactly one chat span with those ids in recv —
// the one its process ended, or, for an attempt lost with its worker, the
// one the worker that recorded it lost made.
func (s *scenario) chatSpans(recv *testenv.OTLP, events []event.Event) bool {
	s.t.Helper()
	return s.namedSpans(recv, events, "the attempts' chat spans, once each with the ids llm_started named", "chat ",
		func(e event.Event) (string, string, bool) {
			d, ok := e.Data.(*event.LLMStarted)
			if !ok {
				return "", "", false
			}
			return fmt.Sprintf("step %d attempt %d", d.Step, d.Attempt), d.Traceparent, true
		})
}

// namedSpans asserts, as figure, that each event of events that begins
// something (named says what, and the traceparent it named) has exactly
// one span whose name starts with prefix and whose ids are those it
// named, waiting up to 10 s for them. It reports whether each had.
func (s *scenario) namedSpans(recv *testenv.OTLP, events []event.Event, figure, prefix string, named func(event.Event) (what, traceparent string, ok bool)) bool {
	s.t.Helper()
	want := map[string]string{} // span id (hex) → what began it
	for _, e := range events {
		what, tp, ok := named(e)
		if !ok {
			continue
		}
		if parts := strings.Split(tp, "-"); len(parts) == 4 {
			want[parts[2]] = what
		} else {
			s.t.Logf("%s: its %s (seq %d) names no span", what, e.Type, e.Seq)
		}
	}
	var made int
	var said []string
	wait.Until(10*time.Second, func() bool {
		count := map[string]int{}
		for _, sp := range recv.Spans() {
			if id := hex.EncodeToString(sp.GetSpanId()); strings.HasPrefix(sp.GetName(), prefix) && want[id] != "" {
				count[id]++
			}
		}
		made, said = 0, nil
		for id, what := range want {
			if count[id] == 1 {
				made++
			} else {
				said = append(said, fmt.Sprintf("%s: %d %q spans with the ids it named (%s)", what, count[id], strings.TrimSpace(prefix), id))
			}
		}
		return made == len(want)
	})
	for _, line := range said {
		s.t.Log(line)
	}
	ok := made == len(want) && len(want) > 0
	s.truth(figure, fmt.Sprintf("%d of %d", len(want), len(want)), fmt.Sprintf("%d of %d", made, len(want)), ok)
	return ok
}

// waitSpans waits until n spans whose names start with prefix were
// exported (a span the scenario's kill must not take with it), for at most
// 10 s.
func waitSpans(t *testing.T, recv *testenv.OTLP, prefix string, n int) {
	t.Helper()
	if !wait.Until(10*time.Second, func() bool {
		got := 0
		for _, sp := range recv.Spans() {
			if strings.HasPrefix(sp.GetName(), prefix) {
				got++
			}
		}
		return got >= n
	}) {
		t.Fatalf("fewer than %d %q spans exported in 10 s", n, prefix)
	}
}
