package cli

import (
	"context"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// awayStore is a store that is away: a turn's end waits for it until its
// context ends.
type awayStore struct{ store.Store }

func (awayStore) FinishTurn(ctx context.Context, _ *event.Turn, _ []model.Message) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestRunStopsWaitingForAnAwayStore: `timebox run`, its turn over, waits
// for a store that is away to take the turn's end at most finishWait,
// says so once it has waited waitNoteAfter, and stops waiting at a
// Ctrl-C (it waited without end, and ignored the first Ctrl-C). On the
// bubble's clock: the waits are exact, and take no real time.
func TestRunStopsWaitingForAnAwayStore(t *testing.T) {
	for _, c := range []struct {
		name   string
		ctrlC  time.Duration // 0: none
		waited time.Duration
	}{
		{"Ctrl-C", waitNoteAfter + 500*time.Millisecond, waitNoteAfter + 500*time.Millisecond},
		{"no Ctrl-C", 0, finishWait},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := awayStore{store.NewMemory()}
				r := &runStore{st: st, rec: store.NewRecorder(st)}
				var errb syncbuf.Buffer
				stop := make(chan struct{})
				if c.ctrlC > 0 {
					time.AfterFunc(c.ctrlC, func() { close(stop) })
				}
				start := time.Now()
				r.finishUnless(&event.Turn{TurnID: "t1"}, nil, stop, IO{Err: &errb})
				if took := time.Since(start); took != c.waited {
					t.Errorf("stopped waiting after %s, want %s", took, c.waited)
				}
				if s := errb.String(); strings.Count(s, "waiting for the store to take the turn's end (it is away; at most 28s more; Ctrl-C stops waiting)") != 1 {
					t.Errorf("stderr %q", s)
				}
			})
		})
	}
}

// TestASilentDatabaseIsNamed: a PostgreSQL address that takes the
// connection and never answers is said to be one, with its URL (no
// password) and the time waited: it was a bare "context deadline
// exceeded" after a minute.
func TestASilentDatabaseIsNamed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 16)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c // taken, never answered
		}
	}()
	defer func() {
		ln.Close()
		<-accepted
		close(conns)
		for c := range conns {
			c.Close()
		}
	}()
	defer func(d, n time.Duration) { openWithin, openNoteAfter = d, n }(openWithin, openNoteAfter)
	openWithin, openNoteAfter = 500*time.Millisecond, 100*time.Millisecond
	var said syncbuf.Buffer
	_, err = openPostgres("postgres://u:s3cret@"+ln.Addr().String()+"/x?sslmode=disable", IO{Err: &said}, nil)
	if err == nil || !strings.Contains(err.Error(), "did not answer within 500ms") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("%v", err)
	}
	// While it waits, it says so: a database that hangs held `timebox
	// run` silent for as long as it hung.
	if s := said.String(); !strings.Contains(s, "waiting for the database at postgres://u:xxxxx@") || !strings.Contains(s, "giving up after 500ms") {
		t.Errorf("said while it waited: %q", s)
	}
}
