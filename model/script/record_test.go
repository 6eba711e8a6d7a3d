package script_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
)

// TestRecordingReplays records a scripted "live" provider and checks the
// recording plays back the same replies with the same timings.
func TestRecordingReplays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		live, _ := script.Parse(strings.NewReader(`{"chunks": ["a", "b", "c"], "first_chunk_delay": "2s", "chunk_delay": "100ms"}
{"text": "go", "tool_calls": [{"name": "crawl", "arguments": {"url": "x"}}], "first_chunk_delay": "1s"}
{"error": {"status": 429, "message": "slow down", "retry_after": "3s"}}
{"chunks": ["x", "y"], "stall_after": 1}`), "live")
		lp, _ := script.New(live)
		var buf bytes.Buffer
		rec := script.NewRecording(&buf)
		p := rec.Wrap(lp)
		for i := range 4 {
			ctx, cancel := context.WithCancelCause(t.Context())
			w := model.Open(ctx, p, model.Request{}, model.Watchdog{Idle: budget.Duration{D: time.Second}}, "m")
			for {
				if _, err := w.Recv(); err != nil {
					break
				}
			}
			w.Close()
			cancel(nil)
			_ = i
		}
		if rec.Err() != nil {
			t.Fatal(rec.Err())
		}
		got, err := script.Parse(bytes.NewReader(buf.Bytes()), "recorded")
		if err != nil || len(got) != 4 {
			t.Fatalf("%v\n%s", err, buf.String())
		}
		if strings.Join(got[0].Chunks, "") != "abc" || got[0].FirstChunkDelay != script.Duration(2*time.Second) || got[0].ChunkDelay != script.Duration(100*time.Millisecond) {
			t.Fatalf("line 1 %+v", got[0])
		}
		if len(got[1].ToolCalls) != 1 || got[1].ToolCalls[0].Name != "crawl" || string(got[1].ToolCalls[0].Arguments) != `{"url":"x"}` {
			t.Fatalf("line 2 %+v", got[1])
		}
		if got[2].Error == nil || got[2].Error.Status != 429 || got[2].Error.RetryAfter != script.Duration(3*time.Second) {
			t.Fatalf("line 3 %+v", got[2])
		}
		if got[3].StallAfter == nil || *got[3].StallAfter != 1 || strings.Join(got[3].Chunks, "") != "x" {
			t.Fatalf("line 4 %+v\n%s", got[3], buf.String())
		}
		// And it plays back.
		rp, _ := script.New(got)
		s, _ := rp.Stream(t.Context(), model.Request{})
		start := time.Now()
		var text string
		for {
			c, err := s.Recv()
			if err == io.EOF {
				break
			}
			text += c.Text
		}
		if text != "abc" || time.Since(start) != 2200*time.Millisecond {
			t.Fatalf("replayed %q in %s", text, time.Since(start))
		}
	})
}

// A compaction call is recorded as a compaction line, so that the replay
// answers the compaction with it and the turn's calls with the rest.
func TestRecordingMarksCompaction(t *testing.T) {
	live, _ := script.Parse(strings.NewReader(`{"text": "the answer"}
{"compaction": true, "text": "the summary"}`), "live")
	lp, _ := script.New(live)
	var buf bytes.Buffer
	rec := script.NewRecording(&buf)
	p := rec.Wrap(lp)
	for _, req := range []model.Request{{Compaction: true}, {}} {
		s, err := p.Stream(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := s.Recv(); err != nil {
				break
			}
		}
		s.Close()
	}
	got, err := script.Parse(bytes.NewReader(buf.Bytes()), "recorded")
	if err != nil || len(got) != 2 || !got[0].Compaction || strings.Join(got[0].Chunks, "") != "the summary" ||
		got[1].Compaction || strings.Join(got[1].Chunks, "") != "the answer" {
		t.Fatalf("%v\n%s", err, buf.String())
	}
}
