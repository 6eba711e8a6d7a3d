package server_test

// The tests of a database that hangs: SIGSTOP freezes PostgreSQL
// (testenv's Freeze, Linux only).

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestReadRoutesOfAHungDatabaseAre503: with its PostgreSQL hanging
// (SIGSTOP: it takes the statements and answers nothing), every route that
// reads the store, and a new turn, answers 503 store_unavailable with
// Retry-After once the database has answered nothing for the store's bound
// (5 s), all of them at once; and 200 once it goes on. Before 2026-11-28
// only the new turn was bounded: every read waited as long as the hang.
func TestReadRoutesOfAHungDatabaseAre503(t *testing.T) {
	pg, e, routes := readRoutes(t)
	routes = append(routes, route{"POST", "/v1/turns", `{"input": "now?", "detach": true}`})
	pg.Freeze()
	thawed := make(chan struct{})
	thaw := sync.OnceFunc(func() { pg.Thaw(); close(thawed) })
	t.Cleanup(thaw) // before the store is closed
	// Each request gives up after 20 s, so that without the bound the
	// test fails rather than waits.
	var wg sync.WaitGroup
	for _, r := range routes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var body any
			if r.body != "" {
				body = r.body
			}
			start := time.Now()
			resp, err := e.doCtx(ctx, r.method, r.path, body)
			took := time.Since(start)
			if err != nil {
				t.Errorf("%s %s on a hung database: no answer after %s: %v", r.method, r.path, took, err)
				return
			}
			var er apiError
			err = json.NewDecoder(resp.Body).Decode(&er)
			resp.Body.Close()
			if retry := resp.Header.Get("Retry-After"); err != nil || resp.StatusCode != http.StatusServiceUnavailable ||
				er.Error.Code != "store_unavailable" || retry == "" {
				t.Errorf("%s %s: %d %s, Retry-After %q: %s (%v)", r.method, r.path, resp.StatusCode, er.Error.Code, retry, er.Error.Message, err)
			}
			if took > 10*time.Second {
				t.Errorf("%s %s answered after %s (bound: 5 s of silence)", r.method, r.path, took)
			}
		})
	}
	wg.Wait()
	thaw()
	for _, r := range routes[:3] {
		resp := e.do(r.method, r.path, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s %s once the database goes on: %d", r.method, r.path, resp.StatusCode)
		}
	}
}

// historyHangs is a PostgreSQL store whose database hangs as the history
// of a new turn is read: after BeginTurn stored the turn.
type historyHangs struct {
	*postgres.Store
	freeze func()
}

func (s *historyHangs) History(ctx context.Context, session string) ([]model.Message, error) {
	s.freeze()
	return s.Store.History(ctx, session)
}

// TestANewTurnWhoseHistoryHangsIs503: the database hangs once the turn is
// stored and before its session's history is read. The client is answered
// 503 store_unavailable within the store's bound (5 s of silence), not
// held for the hang; the turn's end (interrupted, nothing run) is stored
// once the database goes on, and the session takes the next turn. Before
// 2026-11-28 the history read and that end both waited for the database.
func TestANewTurnWhoseHistoryHangsIs503(t *testing.T) {
	pg := testenv.StartPostgres(t)
	st := openNotified(t, pg.Database())
	thaw := sync.OnceFunc(pg.Thaw)
	hs := &historyHangs{Store: st, freeze: sync.OnceFunc(func() {
		pg.Freeze()
		// Without the bound the request would wait for ever: the hang
		// ends after 15 s whatever happens.
		time.AfterFunc(15*time.Second, thaw)
	})}
	e := newEnv(t, server.Config{Store: hs, Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	t.Cleanup(thaw) // before the store is closed
	start := time.Now()
	resp := e.do("POST", "/v1/turns", map[string]any{"input": "go", "session_id": "s1"})
	took := time.Since(start)
	var er apiError
	err := json.NewDecoder(resp.Body).Decode(&er)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || er.Error.Code != "store_unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a new turn whose history hangs: %d %s: %s (%v)", resp.StatusCode, er.Error.Code, er.Error.Message, err)
	}
	if took > 10*time.Second {
		t.Errorf("a new turn whose history hangs answered after %s (bound: 5 s of silence)", took)
	}
	thaw()
	wait.For(t, 15*time.Second, "the refused turn's end stored", func() bool {
		list, err := st.Turns(context.Background(), store.Filter{SessionID: "s1"})
		return err == nil && len(list) == 1 && list[0].Status == budget.StatusInterrupted
	})
	decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "again", "session_id": "s1"}), http.StatusOK)
}
