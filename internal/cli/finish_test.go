package cli

import (
	"context"
	"strings"
	"testing"
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
// Ctrl-C (it waited without end, and ignored the first Ctrl-C).
func TestRunStopsWaitingForAnAwayStore(t *testing.T) {
	st := awayStore{store.NewMemory()}
	r := &runStore{st: st, rec: store.NewRecorder(st)}
	var errb syncbuf.Buffer
	stop := make(chan struct{})
	time.AfterFunc(waitNoteAfter+500*time.Millisecond, func() { close(stop) })
	start := time.Now()
	r.finishUnless(&event.Turn{TurnID: "t1"}, nil, stop, IO{Err: &errb})
	if took := time.Since(start); took > waitNoteAfter+5*time.Second {
		t.Errorf("stopped waiting after %s", took)
	}
	if s := errb.String(); !strings.Contains(s, "waiting for the store to take the turn's end") || !strings.Contains(s, "Ctrl-C stops waiting") {
		t.Errorf("stderr %q", s)
	}
}
