package model_test

import (
	"context"
	"errors"
	"io"
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
