package retry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

var (
	errAway = errors.New("the database is away")
	errBad  = errors.New("a bad row")
)

func away(err error) bool { return errors.Is(err, errAway) }

// TestDo: a write that fails for a reason that passes is tried again until
// it is stored, and the log says so once each way; one that fails otherwise
// is not tried again; ctx's end and Stop return the last failure.
func TestDo(t *testing.T) {
	var log bytes.Buffer
	p := Policy{Transient: away, Backoff: time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil)), What: "the end of turn t1"}
	tries, fails := 0, 0
	p.Failing = func(error, time.Time) { fails++ }
	err := Do(context.Background(), p, func() error {
		tries++
		if tries <= 5 {
			return errAway
		}
		return nil
	})
	if err != nil || tries != 6 || fails != 5 {
		t.Fatalf("err %v after %d tries, %d failures; want nil after 6, 5", err, tries, fails)
	}
	if n := strings.Count(log.String(), "cannot store the end of turn t1"); n != 1 {
		t.Errorf("warned %d times:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), "the end of turn t1 stored once") {
		t.Errorf("no line saying it was stored:\n%s", log.String())
	}

	tries = 0
	if err := Do(context.Background(), p, func() error { tries++; return errBad }); !errors.Is(err, errBad) || tries != 1 {
		t.Errorf("a failure that does not pass: %v after %d tries", err, tries)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := Do(ctx, p, func() error { return errAway }); !errors.Is(err, errAway) {
		t.Errorf("ctx's end: %v, want the last failure", err)
	}

	stop := make(chan struct{})
	close(stop)
	errStopped := errors.New("stopped")
	p.Stop, p.Stopped = stop, func(last error) error { return errors.Join(errStopped, last) }
	if err := Do(context.Background(), p, func() error { return errAway }); !errors.Is(err, errStopped) || !errors.Is(err, errAway) {
		t.Errorf("stopped: %v", err)
	}
}

// TestProgressed: a try that stored part of its write before it failed is
// tried again after the first backoff, not a doubled one, and Do returns
// the failure itself, not the mark.
func TestProgressed(t *testing.T) {
	var waits []time.Duration
	p := Policy{Transient: away, Backoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second,
		After: func(d time.Duration) <-chan time.Time {
			waits = append(waits, d)
			c := make(chan time.Time, 1)
			c <- time.Time{}
			return c
		}}
	tries := 0
	err := Do(context.Background(), p, func() error {
		tries++
		switch {
		case tries <= 3:
			return errAway
		case tries <= 6:
			return Progressed(errAway)
		case tries == 7:
			return errAway
		}
		return errBad
	})
	if err != errBad {
		t.Fatalf("err %v, want %v", err, errBad)
	}
	want := []time.Duration{100, 200, 400, 100, 100, 100, 200}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	if err := Do(context.Background(), Policy{}, func() error { return Progressed(errBad) }); err != errBad {
		t.Errorf("a progressed failure that does not pass: %v, want %v", err, errBad)
	}
}
