package cli

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/timebox-run/timebox/event"
)

func TestLiveViewDrawsChipsWithTimersAndBars(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: termSafe{&out}, raw: &out, live: true, running: map[string]*chip{}}
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

// TestStillWorkingLine: one line per notice, naming each silent call with
// its time and how long none of them has reported progress; a notice
// stored before notices named their calls reads as it did then.
func TestStillWorkingLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		sw   event.StillWorking
		want string
	}{{
		name: "several tool calls",
		sw: event.StillWorking{Step: 1, Subject: "tools legacy_sync, report", ElapsedMS: 2003, Calls: []event.SilentCall{
			{Subject: "tool legacy_sync", CallID: "call_1_4", Tool: "legacy_sync", ElapsedMS: 2003, LimitMS: 1000, SilentMS: 2003},
			{Subject: "tool report", CallID: "call_1_5", Tool: "report", ElapsedMS: 2001, LimitMS: 1000, SilentMS: 2001}}},
		want: "… still working: legacy_sync 2.0s, report 2.0s (no progress for 2.0s)\n",
	}, {
		name: "a call that reported progress, then went silent",
		sw: event.StillWorking{Step: 1, Subject: "tool crawl", CallID: "call_1_2", ElapsedMS: 90000, Calls: []event.SilentCall{
			{Subject: "tool crawl", CallID: "call_1_2", Tool: "crawl", ElapsedMS: 90000, SilentMS: 45000}}},
		want: "… still working: crawl 1m30s (no progress for 45.0s)\n",
	}, {
		name: "a model call",
		sw: event.StillWorking{Step: 2, Subject: "model gpt-x", ElapsedMS: 30000, Calls: []event.SilentCall{
			{Subject: "model gpt-x", ElapsedMS: 30000, SilentMS: 30000}}},
		want: "… still working: model gpt-x 30.0s (no progress for 30.0s)\n",
	}, {
		name: "stored before calls",
		sw:   event.StillWorking{Step: 1, Subject: "tool crawl", CallID: "call_1_2", ElapsedMS: 2000, LimitMS: 10000},
		want: "… still working: tool crawl, 2.0s so far\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			v := &view{w: &out, running: map[string]*chip{}, now: time.Now}
			v.Emit(event.Event{Data: &tc.sw})
			if got := out.String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestViewLetsALongReplysChunksGo: the view keeps a model call's text to
// print before the tool calls it asks for; once the turn joins the reply
// (event.Emitter.ShareReply), the view keeps pieces of the joined reply,
// and the chunks it was given can be collected (issue 29: `timebox run`
// held a long reply twice to its end). The text it prints is the same.
func TestViewLetsALongReplysChunksGo(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: &out, running: map[string]*chip{}}
	em := event.NewEmitter("t1", v)
	started := em.Emit(&event.LLMStarted{Step: 1, Model: "m", Attempt: 1})
	freed := make(chan struct{}, 64)
	var joined strings.Builder
	for i := range 8 {
		b := make([]byte, 4<<10)
		for j := range b {
			b[j] = byte('a' + i)
		}
		runtime.AddCleanup(&b[0], func(struct{}) { freed <- struct{}{} }, struct{}{})
		chunk := unsafe.String(&b[0], len(b))
		joined.WriteString(chunk)
		em.Emit(&event.LLMDelta{Step: 1, Text: chunk})
	}
	reply := joined.String()
	em.ShareReply(started.Seq, 1, reply)
	deadline := time.Now().Add(5 * time.Second)
	for n := 0; n < 8; {
		runtime.GC()
		select {
		case <-freed:
			n++
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("%d of 8 chunks collected after the reply was joined: the view keeps the others", n)
			}
		}
	}
	em.Emit(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Model: "m", Outcome: event.OutcomeOK}, ToolCalls: 1})
	if !strings.Contains(out.String(), reply) {
		t.Errorf("the text before the tool calls was not printed whole (%d bytes out)", out.Len())
	}
	runtime.KeepAlive(em)
}

// TestTheViewWritesControlCharactersOut: what tools, models and people
// send reaches the terminal with its control characters written out, so
// that none can clear the screen, set the window's title or fake a line;
// colors (SGR) and the view's own cursor moves still work.
func TestTheViewWritesControlCharactersOut(t *testing.T) {
	var out bytes.Buffer
	v := newView(&out, false, false)
	v.Emit(event.Event{Data: &event.ToolProgress{CallID: "c", Tool: "fetch", Message: "\x1b[2J\x1b]0;pwned\x07 hi"}})
	v.Emit(event.Event{Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c", Tool: "fetch", Outcome: event.OutcomeError,
		Result: `{"error": {"type": "tool_error", "message": "err\u0000\u001b[31mred\u009bx\r\n"}}`}}})
	v.Emit(event.Event{Data: &event.TurnFinished{Status: "completed", Answer: "done\r\n\x1b[32mgreen\x1b[0m \x1b]52;c;ZXZpbA==\x07"}})
	s := out.String()
	for _, want := range []string{`\x1b[2J\x1b]0;pwned\x07 hi`, `err\x00` + "\x1b[31m" + `red\u009bx`, "done\n\x1b[32mgreen\x1b[0m " + `\x1b]52;c;ZXZpbA==\x07`} {
		if !strings.Contains(s, want) {
			t.Errorf("the view lacks %q:\n%q", want, s)
		}
	}
	for _, bad := range []string{"\x1b[2J", "\x1b]", "\x07", "\x00", "\u009b", "\r"} {
		if strings.Contains(s, bad) {
			t.Errorf("the view sent %q to the terminal:\n%q", bad, s)
		}
	}
}

func TestTermSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, tabs\tand\nlines": "plain text, tabs\tand\nlines",
		"\x1b[1;31mbold red\x1b[0m":    "\x1b[1;31mbold red\x1b[0m",
		"\x1b[2A\x1b[J":                `\x1b[2A\x1b[J`,
		"bell\x07 del\x7f":             `bell\x07 del\x7f`,
		"crlf\r\nlone\rcr":             "crlf\nlone\\x0dcr",
		"c1 \u0085 \u009b, not \u00a0": `c1 \u0085 \u009b, not ` + "\u00a0",
		"\x1b[":                        `\x1b[`,
		"\x1b":                         `\x1b`,
	} {
		var b bytes.Buffer
		n, err := termSafe{&b}.Write([]byte(in))
		if err != nil || n != len(in) || b.String() != want {
			t.Errorf("termSafe(%q) = %q, %d, %v; want %q", in, b.String(), n, err, want)
		}
	}
	clean := []byte("no control characters here, \x1b[32mcolor\x1b[0m")
	if n := testing.AllocsPerRun(100, func() { termSafe{io.Discard}.Write(clean) }); n != 0 {
		t.Errorf("clean text costs %v allocations, want none", n)
	}
}

// TestADeniedCallIsNotAnError: a call a person denied, or nobody decided
// on in time, never ran; its line says so, and not "error:" with time
// against a timeout it never started.
func TestADeniedCallIsNotAnError(t *testing.T) {
	var out bytes.Buffer
	v := &view{w: termSafe{&out}, raw: &out, now: time.Now, told: "the model", running: map[string]*chip{}}
	v.Emit(event.Event{Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c1", Tool: "deploy", Outcome: event.OutcomeDenied,
		Refused: "denied", TimeoutMS: 120000, Result: `{"error": {"type": "tool_denied", "message": "A person denied this call."}}`}}})
	v.Emit(event.Event{Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c2", Tool: "deploy", Outcome: event.OutcomeApprovalExpired,
		Refused: "approval_expired", Phase: "approval", TimeoutMS: 120000, ApprovalMS: 4000}}})
	s := out.String()
	for _, want := range []string{"✗ deploy         not run: denied, the model was told\n",
		"✗ deploy         not run: nobody decided within 4.0s (its approval_timeout), the model was told\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "error:") || strings.Contains(s, "/ 2m") {
		t.Errorf("a call that never ran is drawn as an error against its timeout:\n%s", s)
	}
}

// TestRunsShowSaysTheWaitForPeople: a turn that waited for a person's
// decision says how long, beside its wall clock, and so does the call
// that waited: "after 2h" is not a slow turn when 2h were a person's.
func TestRunsShowSaysTheWaitForPeople(t *testing.T) {
	var out bytes.Buffer
	writeRecord(&out, &event.Turn{TurnID: "t_x", Status: "completed", StopReason: "answered", Steps: 2, WallMS: 7_202_000, ApprovalMS: 7_200_000,
		ToolCalls: []event.ToolCall{{CallID: "call_1_1", Tool: "deploy", Outcome: event.OutcomeDenied, TimeoutMS: 120000, ApprovalMS: 7_200_000}}})
	s := out.String()
	for _, want := range []string{"model 0s · tools 0s · waiting for people 2h0m0s\n", "waited 2h0m0s for a person"} {
		if !strings.Contains(s, want) {
			t.Errorf("lacks %q:\n%s", want, s)
		}
	}
}
