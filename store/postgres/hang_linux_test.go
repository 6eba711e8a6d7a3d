package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestAHungDatabaseRefusesANewTurn: a database that takes the statements
// and does not answer (SIGSTOP) refuses a new turn within BeginTurn's
// bound, as a database that is away does (store.ErrUnavailable: 503
// store_unavailable), rather than holding its client until it is back.
func TestAHungDatabaseRefusesANewTurn(t *testing.T) {
	pg := testenv.StartPostgres(t)
	st := open(t, pg.Database(), postgres.Options{})
	defer st.Close()
	defer postgres.BeginWithin(500 * time.Millisecond)()
	pg.Freeze()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			pg.Thaw()
		}
	}
	defer thaw()
	start := time.Now()
	err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Input: "go"})
	took := time.Since(start)
	thaw()
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer within 500ms") {
		t.Fatalf("BeginTurn on a hung database: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("BeginTurn waited %s for a hung database (bound 500ms)", took)
	}
	// Back, the database takes the turn.
	if err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "t2", Input: "go"}); err != nil {
		t.Fatal(err)
	}
}
