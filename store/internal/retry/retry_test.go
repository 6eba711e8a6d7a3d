package retry

import (
	"bytes"
	"context"
	"errors"
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
