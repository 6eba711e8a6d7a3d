package cli

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/event"
)

func TestLiveViewDrawsChipsWithTimersAndBars(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: &out, live: true, running: map[string]*chip{}}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	v.now = func() time.Time { return now }
	p, total := 3.0, 8.0
	v.Emit(event.Event{At: start, Data: &event.ToolStarted{CallID: "c1", Tool: "crawl", TimeoutMS: 10000, Enforcement: "hard"}})
	v.Emit(event.Event{At: start, Data: &event.ToolStarted{CallID: "c2", Tool: "fetch", TimeoutMS: 1000, Enforcement: "hard"}})
	now = start.Add(1500 * time.Millisecond)
	v.Emit(event.Event{At: now, Data: &event.ToolProgress{CallID: "c1", Progress: &p, Total: &total, Message: "page 3"}})
	s := out.String()
	for _, want := range []string{"crawl", "1.5s", "/ 10s", "███████░", "3/8 page 3", "fetch", "timed out: stopping"} {
		if !strings.Contains(s, want) {
			t.Errorf("live block lacks %q:\n%s", want, s)
		}
	}
	out.Reset()
	v.Emit(event.Event{At: now, Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c2", Tool: "fetch", Outcome: "timed_out", Phase: "tool", DurationMS: 1002, TimeoutMS: 1000}}})
	s = out.String()
	if !strings.Contains(s, "\x1b[2A\x1b[J") || !strings.Contains(s, "⏱ fetch") || strings.Count(s, "crawl") != 1 {
		t.Fatalf("finishing a call must clear the block, print its line and redraw the rest:\n%q", s)
	}
	out.Reset()
	v.Emit(event.Event{At: now, Data: &event.TurnFinished{Status: "stopped", StopReason: "turn_timeout", Message: "Stopped after 2s."}})
	if s := out.String(); !strings.Contains(s, "■ stopped (turn_timeout)") || !strings.Contains(s, "Stopped after 2s.") {
		t.Fatalf("banner:\n%s", s)
	}
}

// TestModelPreviewCostsTheSameForALongReply: the live preview of a model's
// reply is taken from its end, so a delta costs the same at the first
// kilobyte as at the tenth megabyte (it used to convert the whole reply to
// runes on every delta, quadratic work that stalled the turn).
func TestModelPreviewCostsTheSameForALongReply(t *testing.T) {
	v := &view{w: io.Discard, running: map[string]*chip{}, now: time.Now}
	v.Emit(event.Event{Data: &event.LLMStarted{Model: "m", Attempt: 1}})
	chunk := strings.Repeat("wörd ", 40<<10) // 240 KiB, no newline
	for range 40 {
		v.Emit(event.Event{Data: &event.LLMDelta{Text: chunk}})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v.Emit(event.Event{Data: &event.LLMDelta{Text: ""}})
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("one delta allocated %d bytes with %d bytes of reply", got, v.text.Len())
	}
	v.Emit(event.Event{Data: &event.LLMDelta{Text: "the end"}})
	if p := v.running["model"].preview; !strings.HasPrefix(p, "…") || !strings.HasSuffix(p, "wörd wörd the end") || utf8.RuneCountInString(p) != 61 {
		t.Errorf("preview %q", p)
	}
}
