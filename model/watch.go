package model

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
)

// Watchdog holds the budgets every model stream runs under.
type Watchdog struct {
	// FirstChunk bounds the time from sending the request to the first
	// chunk; zero is off.
	FirstChunk budget.Duration
	// Idle bounds the silence between two chunks; zero is off.
	Idle budget.Duration
	// MaxReply bounds the size of one reply: its text plus its tool calls'
	// names and arguments (Chunk.Size). Of the chunk that takes the reply
	// past it only the text that fits is delivered, and the stream is
	// closed at once; zero is no bound.
	MaxReply budget.Count
}

type item struct {
	chunk Chunk
	err   error
	at    time.Time
}

// Watched is a model stream under a Watchdog. Its Recv returns a
// *budget.TimeoutError (phase llm_first_chunk or llm_idle) when a budget
// fires, a *budget.ReplyTooLongError when the reply reaches MaxReply, and
// the context's cause when the context is done; in each case the underlying
// request has been cancelled. Watched is used by one goroutine; Close may
// be called from any.
//
// The provider is read by a goroutine of its own, a bounded number of
// chunks ahead of the reader, so the watchdogs and the context are heard
// even while the provider blocks mid-event; once the context is done,
// Recv reports it before any chunk still buffered.
//
// The watchdogs time the provider, not the reader: each runs while that
// goroutine waits on the provider (for the request and its first chunk,
// then for each next chunk), and never while it waits for a reader that
// fell behind — a slow consumer of the turn's events must not make the
// model look silent (docs/decisions/liveness.md).
type Watched struct {
	w       Watchdog
	subject string
	cancel  context.CancelCauseFunc
	ctx     context.Context
	items   chan item
	done    chan struct{}

	started    time.Time
	firstChunk time.Time
	resp       Response
	err        error
	held       *item // an end of stream found by Ready, for the next Recv
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
	go s.pump(p, req)
	return s
}

func (s *Watched) pump(p Provider, req Request) {
	defer close(s.done)
	// The provider's own context, which the cap closes without ending the
	// reader's: what came before the cap is still delivered, then the cap.
	pctx, pcancel := context.WithCancelCause(s.ctx)
	defer pcancel(nil)
	// The first chunk's watchdog runs from the request to the first chunk.
	wait := s.watch(s.w.FirstChunk, budget.PhaseLLMFirstChunk, s.started)
	st, err := p.Stream(pctx, req)
	if err != nil {
		if te := wait.stop(); te != nil {
			err = te
		}
		s.send(item{err: err, at: time.Now()})
		return
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	defer st.Close()
	var size int64
	for first := true; ; first = false {
		if !first {
			// The idle watchdog runs while the provider is waited on
			// for the next chunk, from now: not while send waited for
			// the reader.
			wait = s.watch(s.w.Idle, budget.PhaseLLMIdle, time.Now())
		}
		c, err := st.Recv()
		if te := wait.stop(); te != nil {
			s.send(item{err: te, at: time.Now()})
			return
		}
		if err == nil {
			size += c.Size()
		}
		if err == io.EOF {
			resp := st.Response()
			// A provider that does not stream its tool calls' sizes is
			// held to the cap by its complete reply.
			size = max(size, resp.Size())
			s.resp = resp // published by the channel send below
		}
		if err == nil || err == io.EOF {
			if cerr := s.overCap(size); cerr != nil {
				pcancel(cerr)
				// What fits of the chunk that crossed the cap is kept, so
				// the partial answer runs right up to it.
				if room := s.w.MaxReply.N - (size - c.Size()); err == nil && room > 0 {
					if t := cutText(c.Text, room); t != "" && !s.send(item{chunk: Chunk{Text: t}, at: time.Now()}) {
						return
					}
				}
				s.send(item{err: cerr, at: time.Now()})
				return
			}
		}
		if !s.send(item{chunk: c, err: err, at: time.Now()}) || err != nil {
			return
		}
	}
}

// waiting is one wait on the provider under a watchdog.
type waiting struct {
	timer *time.Timer
	fired chan *budget.TimeoutError // holds the timeout once the watchdog fired
}

// watch starts the watchdog d (phase) for a wait on the provider that began
// at from: when it fires, the stream is ended with the timeout (its
// context cancelled with it, which Recv reports at once, even if the
// provider does not return). A zero d watches nothing.
func (s *Watched) watch(d budget.Duration, phase budget.Phase, from time.Time) *waiting {
	w := &waiting{fired: make(chan *budget.TimeoutError, 1)}
	if d.Off() {
		return w
	}
	w.timer = time.AfterFunc(d.D-time.Since(from), func() {
		te := d.Expired(phase, s.subject, time.Since(from))
		w.fired <- te
		s.cancel(te)
	})
	return w
}

// stop ends the wait: it returns the timeout when the watchdog fired (the
// provider's answer, if any, came too late), nil when it did not.
func (w *waiting) stop() *budget.TimeoutError {
	if w.timer == nil || w.timer.Stop() {
		return nil
	}
	return <-w.fired
}

// cutText returns the longest start of s of at most n bytes that does not
// end inside a character.
func cutText(s string, n int64) string {
	if int64(len(s)) <= n {
		return s
	}
	s = s[:n]
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				s = s[:i]
			}
			break
		}
	}
	return s
}

// overCap returns a *budget.ReplyTooLongError when a reply of size bytes is
// past MaxReply. It is checked where the provider is read, so that nothing
// past the cap is read, buffered or kept: the provider's request is
// cancelled at once, and the reader gets what came before, then the error.
func (s *Watched) overCap(size int64) error {
	m := s.w.MaxReply
	if m.N <= 0 || size <= m.N {
		return nil
	}
	return &budget.ReplyTooLongError{Limit: m.N, Source: m.Source, Knob: m.Knob, Subject: s.subject}
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
	// A done context wins over chunks already buffered: a turn stopped by
	// its ceiling must not first work through what the provider sent ahead.
	if s.ctx.Err() != nil {
		return Chunk{}, s.fail(budget.Cause(s.ctx))
	}
	if it := s.held; it != nil {
		s.held = nil
		return s.take(*it)
	}
	select {
	case it := <-s.items:
		return s.take(it)
	case <-s.ctx.Done():
		return Chunk{}, s.fail(budget.Cause(s.ctx))
	}
}

// Ready returns a chunk that has already arrived, without waiting, so that a
// reader that fell behind the stream can take what is waiting in one go. It
// returns false when no chunk is waiting, or when the stream has ended or
// failed: the next Recv says how.
func (s *Watched) Ready() (Chunk, bool) {
	if s.err != nil || s.held != nil || s.ctx.Err() != nil {
		return Chunk{}, false
	}
	select {
	case it := <-s.items:
		if it.err != nil {
			s.held = &it
			return Chunk{}, false
		}
		c, _ := s.take(it)
		return c, true
	default:
		return Chunk{}, false
	}
}

// take accounts for one item from the provider's goroutine.
func (s *Watched) take(it item) (Chunk, error) {
	if it.err != nil {
		err := it.err
		if s.ctx.Err() != nil && !errors.Is(err, io.EOF) {
			err = budget.Cause(s.ctx)
		}
		return Chunk{}, s.fail(err)
	}
	if s.firstChunk.IsZero() {
		s.firstChunk = it.at
	}
	return it.chunk, nil
}

// fail ends the stream with err.
func (s *Watched) fail(err error) error {
	s.err = err
	return err
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
		s.cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the stream's reader"})
		<-s.done
	})
	return nil
}
