package model

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// Watchdog holds the budgets every model stream runs under.
type Watchdog struct {
	// FirstChunk bounds the time from sending the request to the first
	// chunk; zero is off.
	FirstChunk budget.Duration
	// Idle bounds the silence between two chunks; zero is off.
	Idle budget.Duration
}

type item struct {
	chunk Chunk
	err   error
	at    time.Time
}

// Watched is a model stream under a Watchdog. Its Recv returns a
// *budget.TimeoutError (phase llm_first_chunk or llm_idle) when a budget
// fires, and the context's cause when the context is done; in both cases
// the underlying request has been cancelled. Watched is used by one
// goroutine; Close may be called from any.
type Watched struct {
	w       Watchdog
	subject string
	cancel  context.CancelCauseFunc
	ctx     context.Context
	items   chan item
	done    chan struct{}
	timer   *time.Timer

	started    time.Time
	firstChunk time.Time
	lastChunk  time.Time
	resp       Response
	err        error
	closeOnce  sync.Once

	mu     sync.Mutex
	stream Stream
}

// Open sends req to p under w and returns the watched stream at once; a
// failure to connect is returned by the first Recv. subject names the model
// for messages ("model gpt-4o").
func Open(ctx context.Context, p Provider, req Request, w Watchdog, subject string) *Watched {
	sctx, cancel := context.WithCancelCause(ctx)
	s := &Watched{
		w: w, subject: subject, cancel: cancel, ctx: sctx,
		items: make(chan item, 64), done: make(chan struct{}),
		started: time.Now(),
	}
	if !w.FirstChunk.Off() {
		s.timer = time.NewTimer(w.FirstChunk.D)
	}
	go s.pump(p, req)
	return s
}

func (s *Watched) pump(p Provider, req Request) {
	defer close(s.done)
	st, err := p.Stream(s.ctx, req)
	if err != nil {
		s.send(item{err: err, at: time.Now()})
		return
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	defer st.Close()
	for {
		c, err := st.Recv()
		if err == io.EOF {
			s.resp = st.Response() // published by the channel send below
		}
		if !s.send(item{chunk: c, err: err, at: time.Now()}) || err != nil {
			return
		}
	}
}

func (s *Watched) send(it item) bool {
	select {
	case s.items <- it:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// Recv returns the next chunk, io.EOF at the end of the reply, or the
// error that ended the stream.
func (s *Watched) Recv() (Chunk, error) {
	if s.err != nil {
		return Chunk{}, s.err
	}
	var fire <-chan time.Time
	if s.timer != nil {
		fire = s.timer.C
	}
	select {
	case it := <-s.items:
		if it.err != nil {
			s.err = it.err
			if s.ctx.Err() != nil && !errors.Is(it.err, io.EOF) {
				s.err = budget.Cause(s.ctx)
			}
			s.stopTimer()
			return Chunk{}, s.err
		}
		if s.firstChunk.IsZero() {
			s.firstChunk = it.at
		}
		s.lastChunk = it.at
		s.resetTimer()
		return it.chunk, nil
	case <-fire:
		now := time.Now()
		var te *budget.TimeoutError
		if s.firstChunk.IsZero() {
			te = &budget.TimeoutError{Phase: budget.PhaseLLMFirstChunk, Limit: s.w.FirstChunk.D,
				Elapsed: now.Sub(s.started), Source: s.w.FirstChunk.Source, Knob: s.w.FirstChunk.Knob, Subject: s.subject}
		} else {
			te = &budget.TimeoutError{Phase: budget.PhaseLLMIdle, Limit: s.w.Idle.D,
				Elapsed: now.Sub(s.lastChunk), Source: s.w.Idle.Source, Knob: s.w.Idle.Knob, Subject: s.subject}
		}
		s.timer = nil
		s.cancel(te)
		s.err = te
		return Chunk{}, te
	case <-s.ctx.Done():
		s.stopTimer()
		s.err = budget.Cause(s.ctx)
		return Chunk{}, s.err
	}
}

func (s *Watched) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

func (s *Watched) resetTimer() {
	if s.w.Idle.Off() {
		s.stopTimer()
		return
	}
	if s.timer == nil {
		s.timer = time.NewTimer(s.w.Idle.D)
		return
	}
	s.timer.Reset(s.w.Idle.D)
}

// Response returns the complete reply after Recv returned io.EOF.
func (s *Watched) Response() Response { return s.resp }

// FirstChunk returns the time from Open to the first chunk, or zero.
func (s *Watched) FirstChunk() time.Duration {
	if s.firstChunk.IsZero() {
		return 0
	}
	return s.firstChunk.Sub(s.started)
}

// Started returns when the stream was opened.
func (s *Watched) Started() time.Time { return s.started }

// Close cancels the request if it is still under way and waits until the
// provider's goroutine has returned. It is idempotent.
func (s *Watched) Close() error {
	s.closeOnce.Do(func() {
		s.stopTimer()
		s.cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the stream's reader"})
		<-s.done
	})
	return nil
}
