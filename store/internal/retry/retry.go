// Package retry is the loop the durable stores share to write what must
// be stored whatever happens meanwhile: the write is tried again, after a
// backoff that doubles, while it fails for a reason that passes (the
// database is away, a lock is held), until it is stored, fails otherwise,
// its context ends or the store stops (docs/decisions/store-outages.md).
package retry

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Policy says which failures pass and how long to wait between tries.
type Policy struct {
	// Transient reports whether an error passes. Nil: none does.
	Transient func(error) bool
	// Backoff is the first wait, doubled up to MaxBackoff: 100ms and 5s.
	Backoff, MaxBackoff time.Duration
	// Stop, when closed, ends the waiting: Do returns Stopped's error.
	Stop <-chan struct{}
	// Stopped makes the error Do returns when Stop was closed, from the
	// last failure.
	Stopped func(last error) error
	// Failing, when set, is called after each failure that passes with
	// the failure and when the first one happened.
	Failing func(err error, since time.Time)
	// Log, when set, is told of the first failure that passes and of the
	// write stored after failures; What names the write there ("the end
	// of turn t1") and Attrs say where (the database).
	Log   *slog.Logger
	What  string
	Attrs []any
	// After, when set, stands in for the timer of each wait (tests).
	After func(time.Duration) <-chan time.Time
}

// Progressed marks err, the failure of a try that stored part of its write
// for good — a long text's first pieces — so that the next try, which goes
// on from there, comes after the first backoff again and not a doubled one:
// a write that moves forward between cuts of its connection is not made to
// wait as if the database were away.
func Progressed(err error) error {
	if err == nil {
		return nil
	}
	return progressed{err}
}

type progressed struct{ error }

func (p progressed) Unwrap() error { return p.error }

// Do runs try until it returns nil or an error that does not pass, ctx
// ends or p.Stop is closed, and returns its last error (ctx's end returns
// the last failure, not ctx's error: it says why nothing was stored).
func Do(ctx context.Context, p Policy, try func() error) error {
	first := p.Backoff
	if first <= 0 {
		first = 100 * time.Millisecond
	}
	wait := first
	most := p.MaxBackoff
	if most <= 0 {
		most = 5 * time.Second
	}
	var since time.Time
	for {
		err := try()
		var pr progressed
		moved := errors.As(err, &pr)
		if top, ok := err.(progressed); ok {
			err = top.error
		}
		if err == nil || p.Transient == nil || !p.Transient(err) {
			if err == nil && !since.IsZero() && p.Log != nil {
				p.Log.Info(p.What+" stored once the store could be written again",
					append(p.Attrs, "after", time.Since(since).Round(time.Millisecond))...)
			}
			return err
		}
		if since.IsZero() {
			since = time.Now()
			if p.Log != nil {
				p.Log.Warn("cannot store "+p.What+"; trying again until it is", append(p.Attrs, "err", err)...)
			}
		}
		if p.Failing != nil {
			p.Failing(err, since)
		}
		if moved {
			wait = first
		}
		if !p.sleep(ctx, wait) {
			if ctx.Err() == nil && p.Stopped != nil {
				return p.Stopped(err)
			}
			return err
		}
		wait = min(2*wait, most)
	}
}

// sleep waits d, and reports false if ctx ended or p.Stop was closed first.
func (p Policy) sleep(ctx context.Context, d time.Duration) bool {
	var c <-chan time.Time
	if p.After != nil {
		c = p.After(d)
	} else {
		t := time.NewTimer(d)
		defer t.Stop()
		c = t.C
	}
	select {
	case <-c:
		return true
	case <-ctx.Done():
		return false
	case <-p.Stop:
		return false
	}
}
