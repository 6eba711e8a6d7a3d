//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/procmem"
)

// The turn budget of the stream scenarios: issue 9's 4s.
const streamTurn = 4 * time.Second

// Model streams that never end, from an OpenAI-compatible endpoint
// (internal/fakellm, the real SSE wire format).
var (
	// flood256K: 256 KiB of text a chunk, as fast as the connection
	// takes it. At the default limits.max_reply (1MiB) it ends the turn
	// reply_too_long in a fraction of a second.
	flood256K = fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: text(256 << 10)}}}
	// paced256K: 256 KiB every 100ms (2.5 MiB/s): with the cap raised to
	// 16MiB the turn ceiling comes first, with 10 MiB read.
	paced256K = fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: text(256 << 10), Delay: 100 * time.Millisecond}}}
	// flood1B: one byte a chunk, as fast as it goes: the most events per
	// second, the cap never reached in 4s.
	flood1B = fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: "x"}}}
)

func text(n int) string {
	return strings.Repeat("all work and no play makes jack a dull boy ", n/43+1)[:n]
}

// openAIAgent writes an agent on a fake OpenAI endpoint; its key is in
// FAKE_KEY.
func openAIAgent(t *testing.T, s *fakellm.Server) agentDir {
	return newAgent(t, fmt.Sprintf("name: faults\nmodel: {primary: 'openai:endless'}\nproviders: {openai: {base_url: %q, credentials: [{api_key_env: FAKE_KEY}]}}\n", s.BaseURL()), nil, nil)
}

// endlessStream: a model that never stops streaming, through `timebox
// run --json` with the store on and through `timebox serve` to an SSE
// client. The turn ends at limits.max_reply or within 200ms of
// timeouts.turn (4s), timebox stays under 300 MB, and the stored turn is
// what was emitted, its answer included.
func endlessStream(t *testing.T) {
	cases := []struct {
		name     string
		reply    fakellm.Reply
		maxReply string
		serve    bool
		reason   budget.StopReason
		// exit bounds how long after timeouts.turn timebox run exits, or
		// turn_finished reaches the client: the end of the turn, then
		// writing its record and answer (10 MiB of it with the cap
		// raised), in the store and as JSON.
		exit time.Duration
	}{
		{name: "256 KiB chunks without pause", reply: flood256K, reason: budget.ReplyTooLong},
		{name: "1-byte chunks without pause", reply: flood1B, reason: budget.TurnTimeout, exit: time.Second},
		{name: "1-byte chunks without pause", reply: flood1B, reason: budget.TurnTimeout, exit: time.Second, serve: true},
		{name: "256 KiB chunks every 100ms, --max-reply 16MiB", reply: paced256K, maxReply: "16MiB", reason: budget.TurnTimeout, exit: 3 * time.Second},
		{name: "256 KiB chunks every 100ms, --max-reply 16MiB", reply: paced256K, maxReply: "16MiB", reason: budget.TurnTimeout, exit: 3 * time.Second, serve: true},
	}
	for _, tc := range cases {
		via := "timebox run --json"
		if tc.serve {
			via = "timebox serve, an SSE client"
		}
		t.Run(tc.name+"/"+via, func(t *testing.T) {
			sc := begin(t, "endless stream: "+tc.name, via)
			srv := fakellm.New(fakellm.OpenAI, tc.reply)
			defer srv.Close()
			a := openAIAgent(t, srv)
			env := []string{"FAKE_KEY=k"}
			flags := []string{"--turn-timeout", streamTurn.String()}
			if tc.maxReply != "" {
				flags = append(flags, "--max-reply", tc.maxReply)
			}
			var seen []event.Event
			var took time.Duration // from the start of the turn to its end reaching the client
			var peak int64
			var tb *proc
			if tc.serve {
				var url string
				tb, url = startServe(t, a, env, flags...)
				start := time.Now()
				f := postTurn(t, url, `{"input": "Go on for ever."}`)
				if _, ok := f.log.waitFor(event.TypeTurnFinished, 30*time.Second); !ok {
					t.Fatalf("the stream ended without turn_finished\n%s", tb.stderr.String())
				}
				took = time.Since(start)
				peak = procmem.Peak(tb.pid()) // a high-water mark: read once at the end
				f.leave()
				seen = f.log.snapshot()
				tb.cmd.Process.Signal(syscall.SIGTERM)
				if code := tb.wait(30 * time.Second); code != 0 {
					t.Errorf("serve exited %d after SIGTERM\n%s", code, tb.stderr.String())
				}
			} else {
				tb = startTimebox(t, a.dir, env, nil, append(append([]string{"run", "-f", a.file, "--db", a.db, "--json"}, flags...), "Go on for ever.")...)
				code := tb.wait(30 * time.Second)
				if want := 3; code != want {
					t.Errorf("exit %d, want %d (stopped by a budget)\n%s", code, want, tb.stderr.String())
				}
				took = tb.took
				peak = tb.peak()
				seen = tb.log.snapshot()
			}
			fin := finished(seen)
			if fin == nil {
				t.Fatalf("no turn_finished\n%s", tb.stderr.String())
			}
			sc.is("stop reason", string(fin.StopReason), string(tc.reason))
			wall := time.Duration(fin.Totals.WallMS) * time.Millisecond
			if tc.reason == budget.TurnTimeout {
				sc.within("turn ended past timeouts.turn (4s)", wall-streamTurn, 200*time.Millisecond)
				what := "timebox run exited past timeouts.turn"
				if tc.serve {
					what = "turn_finished reached the client past timeouts.turn"
				}
				sc.within(what, took-streamTurn, tc.exit)
			} else {
				sc.within("turn ended (timeouts.turn 4s)", wall, streamTurn)
			}
			sc.memory("peak memory of timebox", peak, 300)
			sc.nothingLeft(tb.pid())
			rec, evs := stored(t, a.db, "")
			t.Logf("%d llm_delta events, %d bytes of answer kept", countType(seen, event.TypeLLMDelta), len(fin.Answer))
			sc.records(seen, rec, evs)
		})
	}
}

func countType(events []event.Event, typ event.Type) int {
	n := 0
	for _, e := range events {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// endlessStreamLibrary: the same endless stream of 1-byte chunks,
// through the library (timebox.Open, Agent.Run) under a 1s turn budget:
// Run returns within 200ms of it, and nothing it started is left, not a
// goroutine (spec §14).
func endlessStreamLibrary(t *testing.T) {
	sc := begin(t, "endless stream: 1-byte chunks without pause", "library (timebox.Open, Run), turn 1s")
	srv := fakellm.New(fakellm.OpenAI, flood1B)
	defer srv.Close()
	a := openAIAgent(t, srv)
	baseline := runtime.NumGoroutine()
	const turn = time.Second
	ag, err := timebox.Open(context.Background(), filepath.Join(a.dir, "agent.yaml"), timebox.Options{
		Getenv:    func(k string) string { return map[string]string{"FAKE_KEY": "k"}[k] },
		Overrides: config.Overrides{Flags: map[string]string{"timeouts.turn": turn.String()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := ag.Run(context.Background(), agent.Input{Text: "Go on for ever."})
	took := time.Since(start)
	ag.Close()
	sc.is("stop reason", string(res.Record.StopReason), string(budget.TurnTimeout))
	sc.within("Run returned past timeouts.turn (1s)", took-turn, 200*time.Millisecond)
	select {
	case <-srv.Gone(0):
	case <-time.After(5 * time.Second):
		t.Error("the model's stream is still open 5s after Run returned")
	}
	sc.goroutines(baseline)
}

// goroutines asserts that the number of goroutines is back to baseline,
// waiting up to 5s for those on their way out.
func (s *scenario) goroutines(baseline int) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > baseline {
		buf := make([]byte, 1<<20)
		s.t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	s.addKind(kindLeft, "goroutines above the baseline", "≤ 0", fmt.Sprint(n-baseline), n <= baseline)
}

// slowWriter is the reader of a pipe that stops reading for pause at its
// first write, then reads at once: a `timebox run --json | (sleep 3; cat)`.
type slowWriter struct {
	pause  time.Duration
	paused bool
	n      int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if !w.paused {
		w.paused = true
		time.Sleep(w.pause)
	}
	w.n += len(p)
	return len(p), nil
}

// slowReaderOfAReply: a model sends a whole reply of 3,000 chunks at
// once, while the reader of `timebox run --json` stops reading for 3 s,
// longer than --llm-idle-timeout 1s. timebox's sink waits on the pipe,
// and its stream's reader with it: the model was not silent, so the turn
// is answered on its first attempt (it was stopped llm_idle, blamed on
// the model, in most runs: the idle clock ran while timebox waited on its
// own reader).
func slowReaderOfAReply(t *testing.T) {
	sc := begin(t, "a reader of the events slower than llm_idle", "timebox run --json | (sleep 3; cat)")
	chunks := make([]fakellm.Chunk, 3000)
	for i := range chunks {
		chunks[i] = fakellm.Chunk{Text: "x"}
	}
	srv := fakellm.New(fakellm.OpenAI, fakellm.Reply{Chunks: chunks})
	defer srv.Close()
	a := openAIAgent(t, srv)
	w := &slowWriter{pause: 3 * time.Second}
	p := startTimebox(t, a.dir, []string{"FAKE_KEY=k"}, w, "run", "-f", a.file, "--db", a.db, "--json", "--llm-idle-timeout", "1s", "Say x.")
	code := p.wait(60 * time.Second)
	sc.is("exit code", fmt.Sprint(code), "0")
	rec, _ := stored(t, a.db, "")
	if rec == nil {
		t.Fatalf("no stored turn\n%s", p.stderr.String())
	}
	sc.is("stop reason", string(rec.StopReason), string(budget.Answered))
	sc.count("model attempts", len(rec.ModelCalls), 1)
	sc.count("bytes of answer", len(rec.Answer), 3000)
	sc.nothingLeft(p.pid())
}
