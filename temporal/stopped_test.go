package temporal_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestAWorkerStoppedMidAttempt: a worker stopped (SIGTERM, a deploy) while
// a model attempt streams gives it up, and another worker asks the step
// again. The given-up attempt's record says the worker stopping gave it
// up, not that the turn's workflow cancelled it: nothing cancelled the
// turn, and a person reading the timeline must not look for who did.
func TestAWorkerStoppedMidAttempt(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	id := agent.NewTurnID()
	queue += "-" + id
	file := slowAttemptAgent(t, "stopped")
	wa := runningWorker(t, c, queue, openAgent(t, file).Agent, s)
	done := startRun(t, c, s, queue, openAgent(t, file).Agent, id)
	waitStored(t, s, id, event.TypeLLMStarted, "the attempt to start")
	wa.Stop()
	startWorker(t, c, s, queue, openAgent(t, file).Agent)
	res := <-done
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn %s (%s)", res.Record.Status, res.Record.Message)
	}
	for _, mc := range res.Record.ModelCalls {
		t.Logf("attempt %d: %s %s %q", mc.Attempt, mc.Outcome, mc.Phase, mc.Error)
		if mc.Outcome != event.OutcomeOK && (strings.Contains(mc.Error, "workflow") || !strings.Contains(mc.Error, "worker")) {
			t.Errorf("the attempt given up by the stopping worker says %q; want it to name the worker stopping", mc.Error)
		}
	}
}

// TestAStoppedWorkerRecordsWhatItGaveUp: a worker stopped (SIGTERM) while a
// model attempt streams returns from Stop once the attempt it gave up is
// recorded and its chat span ended, though its store is slow: `timebox
// worker` closes its store and shuts its tracing down when Stop returns.
// Before, Temporal's Stop returned at once, and the unit recorded the
// attempt after that, or not at all: the next worker then recorded it
// lost with a worker that died (worker_lost), and its span was never
// exported.
func TestAStoppedWorkerRecordsWhatItGaveUp(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue, dsn := setupDSN(t)
	id := agent.NewTurnID()
	queue += "-" + id
	file := slowAttemptAgent(t, "stopped-slow-store")
	ps, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	tp, spans := recorded(t)
	wa := runningWorker(t, c, queue, openTraced(t, file, tp), &slowRecords{Store: ps, delay: time.Second})
	done := startRun(t, c, s, queue, openAgent(t, file).Agent, id)
	waitStored(t, s, id, event.TypeLLMStarted, "the attempt to start")
	wa.Stop()
	// What was stored and ended when Stop returned.
	evs, err := s.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var given *event.ModelCall
	for _, e := range evs {
		if f, ok := e.Data.(*event.LLMFinished); ok && f.Step == 1 && f.Attempt == 1 {
			given = &f.ModelCall
		}
	}
	if given == nil {
		t.Errorf("when the worker's Stop returned, the attempt it gave up had no record stored")
	} else if !strings.Contains(given.Error, "the worker, stopping") {
		t.Errorf("the attempt given up by the stopping worker says %q; want it to name the worker stopping", given.Error)
	}
	chats := 0
	for _, sp := range spans.Ended() {
		if strings.HasPrefix(sp.Name(), "chat ") {
			chats++
		}
	}
	if chats != 1 {
		t.Errorf("when the worker's Stop returned, it had ended %d chat spans; want 1, the given-up attempt's", chats)
	}
	startWorker(t, c, s, queue, openAgent(t, file).Agent)
	res := <-done
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn %s (%s)", res.Record.Status, res.Record.Message)
	}
	for _, mc := range res.Record.ModelCalls {
		if mc.Attempt == 1 && mc.Outcome != event.OutcomeCancelled {
			t.Errorf("the attempt given up by the stopping worker was recorded %s/%s %q; want cancelled by the worker, stopping", mc.Outcome, mc.Phase, mc.Error)
		}
	}
}

// slowRecords is a worker's store that takes delay to store each
// llm_finished, as a loaded database may.
type slowRecords struct {
	*postgres.Store
	delay time.Duration
}

func (s *slowRecords) AppendEvent(ctx context.Context, e event.Event) error {
	if e.Type == event.TypeLLMFinished {
		time.Sleep(s.delay)
	}
	return s.Store.AppendEvent(ctx, e)
}
