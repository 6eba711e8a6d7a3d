package model_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// timed is a provider whose stream sends chunks at the given offsets, then
// either ends or (hang) goes silent until its context ends.
type timed struct {
	at      []time.Duration
	hang    bool
	openErr error
}

func (p timed) Stream(ctx context.Context, _ model.Request) (model.Stream, error) {
	if p.openErr != nil {
		return nil, p.openErr
	}
	return &timedStream{ctx: ctx, p: p, start: time.Now()}, nil
}

type timedStream struct {
	ctx   context.Context
	p     timed
	start time.Time
	i     int
}

func (s *timedStream) Recv() (model.Chunk, error) {
	if s.i >= len(s.p.at) {
		if s.p.hang {
			<-s.ctx.Done()
			return model.Chunk{}, s.ctx.Err()
		}
		return model.Chunk{}, io.EOF
	}
	select {
	case <-time.After(time.Until(s.start.Add(s.p.at[s.i]))):
	case <-s.ctx.Done():
		return model.Chunk{}, s.ctx.Err()
	}
	s.i++
	return model.Chunk{Text: "x"}, nil
}
func (s *timedStream) Response() model.Response { return model.Response{Text: "done"} }
func (s *timedStream) Close() error             { return nil }

func wd(first, idle time.Duration) model.Watchdog {
	return model.Watchdog{FirstChunk: budget.Duration{D: first, Knob: budget.KeyLLMFirstChunk},
		Idle: budget.Duration{D: idle, Knob: budget.KeyLLMIdle}}
}

func drain(s *model.Watched) (int, error) {
	n := 0
	for {
		_, err := s.Recv()
		if err != nil {
			return n, err
		}
		n++
	}
}

func TestWatchdog(t *testing.T) {
	cases := []struct {
		name    string
		p       timed
		w       model.Watchdog
		chunks  int
		phase   budget.Phase
		elapsed time.Duration // when the stream ended, from Open
	}{
		{"completes", timed{at: []time.Duration{time.Second, 2 * time.Second}}, wd(5*time.Second, 5*time.Second), 2, "", 2 * time.Second},
		{"no first chunk", timed{hang: true}, wd(5*time.Second, time.Second), 0, budget.PhaseLLMFirstChunk, 5 * time.Second},
		{"first chunk late", timed{at: []time.Duration{6 * time.Second}}, wd(5*time.Second, time.Minute), 0, budget.PhaseLLMFirstChunk, 5 * time.Second},
		{"silent mid-stream", timed{at: []time.Duration{time.Second, 2 * time.Second}, hang: true}, wd(5*time.Second, 3*time.Second), 2, budget.PhaseLLMIdle, 5 * time.Second},
		{"gap between chunks", timed{at: []time.Duration{time.Second, 10 * time.Second}}, wd(5*time.Second, 3*time.Second), 1, budget.PhaseLLMIdle, 4 * time.Second},
		{"watchdogs off", timed{at: []time.Duration{time.Hour}}, wd(0, 0), 1, "", time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				s := model.Open(t.Context(), tc.p, model.Request{}, tc.w, "model m")
				defer s.Close()
				n, err := drain(s)
				if n != tc.chunks || time.Since(start) != tc.elapsed {
					t.Fatalf("%d chunks after %s", n, time.Since(start))
				}
				if tc.phase == "" {
					if err != io.EOF || s.Response().Text != "done" {
						t.Fatalf("err %v", err)
					}
					return
				}
				te, ok := budget.AsTimeout(err)
				if !ok || te.Phase != tc.phase || te.Subject != "model m" {
					t.Fatalf("err %v", err)
				}
				if _, err2 := s.Recv(); err2 != err {
					t.Fatal("Recv after the end must keep returning the error")
				}
			})
		})
	}
}

func TestOpenErrorAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := &model.Error{Provider: "p", Status: 503, Message: "busy"}
		s := model.Open(t.Context(), timed{openErr: boom}, model.Request{}, wd(time.Second, time.Second), "model m")
		if _, err := s.Recv(); !errors.Is(err, boom) || model.Phase(err) != budget.PhaseLLMHTTP {
			t.Fatalf("err %v", err)
		}
		s.Close()

		ctx, cancel := context.WithCancelCause(t.Context())
		s = model.Open(ctx, timed{hang: true}, model.Request{}, wd(0, 0), "model m")
		time.AfterFunc(time.Second, func() { cancel(&budget.CancelError{Reason: budget.ClientGone}) })
		_, err := s.Recv()
		if ce, ok := budget.AsCancel(err); !ok || ce.Reason != budget.ClientGone || model.Phase(err) != budget.PhaseCancel {
			t.Fatalf("err %v", err)
		}
		s.Close()
		s.Close() // idempotent
	})
}

// burst is a provider whose stream sends its chunks as fast as they are
// read, then ends with resp; endless repeats the last chunk for ever. It
// counts the chunks it was asked for.
type burst struct {
	chunks  []model.Chunk
	resp    model.Response
	endless bool
	reads   *int
}

func (p burst) Stream(ctx context.Context, _ model.Request) (model.Stream, error) {
	return &burstStream{ctx: ctx, p: p}, nil
}

type burstStream struct {
	ctx context.Context
	p   burst
	i   int
}

func (s *burstStream) Recv() (model.Chunk, error) {
	if err := s.ctx.Err(); err != nil {
		return model.Chunk{}, err
	}
	if s.i >= len(s.p.chunks) && !s.p.endless {
		return model.Chunk{}, io.EOF
	}
	c := s.p.chunks[min(s.i, len(s.p.chunks)-1)]
	s.i++
	if s.p.reads != nil {
		*s.p.reads = s.i
	}
	return c, nil
}
func (s *burstStream) Response() model.Response { return s.p.resp }
func (s *burstStream) Close() error             { return nil }

// TestReplyCap: a reply is held to limits.max_reply, its text and its tool
// calls counted together, whether the provider streams the tool calls'
// sizes or only has them in its complete reply. Of the chunk that goes past
// the cap only the text that fits is delivered (never half a character),
// and the provider is not read further.
func TestReplyCap(t *testing.T) {
	text := func(n int) model.Chunk { return model.Chunk{Text: strings.Repeat("a", n)} }
	args := func(n int) model.Chunk { return model.Chunk{ToolBytes: n} }
	cases := []struct {
		name   string
		p      burst
		limit  int64
		text   string // delivered
		chunks int    // delivered
		reads  int    // asked of the provider
		capped bool   // ends with ReplyTooLongError, else io.EOF
	}{
		{name: "under the cap", p: burst{chunks: []model.Chunk{text(40), text(40)}}, limit: 100, text: strings.Repeat("a", 80), chunks: 2, reads: 2},
		{name: "exactly the cap", p: burst{chunks: []model.Chunk{text(50), text(50)}}, limit: 100, text: strings.Repeat("a", 100), chunks: 2, reads: 2},
		{name: "text past the cap: cut at the cap", p: burst{chunks: []model.Chunk{text(60), text(60), text(60)}}, limit: 100,
			text: strings.Repeat("a", 100), chunks: 2, reads: 2, capped: true},
		{name: "never half a character", p: burst{chunks: []model.Chunk{text(98), {Text: "€€"}}}, limit: 100,
			text: strings.Repeat("a", 98), chunks: 1, reads: 2, capped: true},
		{name: "text and tool-call arguments past the cap", p: burst{chunks: []model.Chunk{text(60), args(30), args(30)}}, limit: 100,
			text: strings.Repeat("a", 60), chunks: 2, reads: 3, capped: true},
		{name: "endless stream", p: burst{chunks: []model.Chunk{text(7)}, endless: true}, limit: 1000,
			text: strings.Repeat("a", 1000), chunks: 143, reads: 143, capped: true},
		{name: "tool calls only in the complete reply", limit: 100, text: strings.Repeat("a", 10), chunks: 1, reads: 1, capped: true,
			p: burst{chunks: []model.Chunk{text(10)}, resp: model.Response{Text: strings.Repeat("a", 10),
				ToolCalls: []model.ToolCall{{Name: "echo", Arguments: strings.Repeat("x", 100)}}}}},
		{name: "no cap", p: burst{chunks: []model.Chunk{text(1000), args(1000)}}, limit: 0, text: strings.Repeat("a", 1000), chunks: 2, reads: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				reads := 0
				tc.p.reads = &reads
				w := wd(time.Second, time.Second)
				w.MaxReply = budget.Count{N: tc.limit, Source: budget.SourceFlag, Knob: "--max-reply"}
				s := model.Open(t.Context(), tc.p, model.Request{}, w, "model m")
				defer s.Close()
				var got strings.Builder
				n := 0
				var err error
				for {
					var c model.Chunk
					if c, err = s.Recv(); err != nil {
						break
					}
					got.WriteString(c.Text)
					n++
				}
				synctest.Wait()
				if got.String() != tc.text || n != tc.chunks || reads != tc.reads {
					t.Errorf("%d chunks delivered with %q, %d read from the provider; want %d with %q, %d", n, got.String(), reads, tc.chunks, tc.text, tc.reads)
				}
				if !tc.capped {
					if err != io.EOF {
						t.Fatalf("err %v, want io.EOF", err)
					}
					return
				}
				re, ok := budget.AsReplyTooLong(err)
				if !ok || re.Limit != tc.limit || re.Knob != "--max-reply" || re.Source != budget.SourceFlag || re.Subject != "model m" {
					t.Fatalf("err %v, want the reply cap", err)
				}
				if model.Phase(err) != budget.PhaseLLMReplyCap || model.Phase(err).IsLLM() {
					t.Fatalf("phase %s", model.Phase(err))
				}
			})
		})
	}
}

// TestCancelBeatsBufferedChunks: once the context is done, Recv says so at
// once, even with chunks the provider sent ahead still buffered — a turn
// stopped by its ceiling does not first work through a flood.
func TestCancelBeatsBufferedChunks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 20 {
			ctx, cancel := context.WithCancelCause(t.Context())
			s := model.Open(ctx, burst{chunks: []model.Chunk{{Text: "x"}}, endless: true}, model.Request{}, wd(0, 0), "model m")
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // the provider's goroutine has filled the buffer
			cancel(&budget.TimeoutError{Phase: budget.PhaseTurn, Limit: time.Second})
			_, err := s.Recv()
			if te, ok := budget.AsTimeout(err); !ok || te.Phase != budget.PhaseTurn {
				t.Fatalf("Recv after the cancellation: %v, want the turn timeout", err)
			}
			s.Close()
		}
	})
}

// TestReady: a reader that fell behind takes what has already arrived
// without waiting; the end of the stream is left for Recv.
func TestReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chunks := []model.Chunk{{Text: "a"}, {Text: "b"}, {Text: "c"}, {Text: "d"}}
		s := model.Open(t.Context(), burst{chunks: chunks, resp: model.Response{Text: "abcd"}}, model.Request{}, wd(time.Second, time.Second), "model m")
		defer s.Close()
		c, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := c.Text
		synctest.Wait()
		for {
			c, ok := s.Ready()
			if !ok {
				break
			}
			got += c.Text
		}
		if got != "abcd" {
			t.Fatalf("got %q", got)
		}
		if _, err := s.Recv(); err != io.EOF || s.Response().Text != "abcd" {
			t.Fatalf("err %v", err)
		}
		if _, ok := s.Ready(); ok {
			t.Fatal("Ready after the end")
		}
	})
}

// TestASlowReaderIsNotTheModelsSilence: a provider that sends its whole
// reply at once, read by a reader slower than llm_idle between chunks (a
// sink that blocks on a slow pipe), gets no idle timeout: the watchdogs
// time the provider, and it was never silent. (The idle timer was reset
// when the reader took a chunk, so a reader that fell behind found it
// fired, and the model was blamed, and failed over.) And the provider
// held back by a reader that fell behind 64 chunks is not silent either.
func TestASlowReaderIsNotTheModelsSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chunks := make([]model.Chunk, 200)
		for i := range chunks {
			chunks[i] = model.Chunk{Text: "x"}
		}
		s := model.Open(t.Context(), burst{chunks: chunks, resp: model.Response{Text: "done"}}, model.Request{}, wd(time.Second, 300*time.Millisecond), "model m")
		defer s.Close()
		n := 0
		for {
			_, err := s.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d chunks: %v", n, err)
			}
			n++
			time.Sleep(500 * time.Millisecond) // the reader, slower than llm_idle
		}
		if n != len(chunks) {
			t.Errorf("%d chunks of %d", n, len(chunks))
		}
	})
}
