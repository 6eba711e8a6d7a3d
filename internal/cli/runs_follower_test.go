package cli

import (
	"context"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestRunFollowsItsEngineTurn: `timebox run --engine temporal` stores its
// turn with itself as its follower, as its caller: a gateway sharing the
// database adopts it only once this run is gone, and this run, finding
// its turn followed elsewhere, would stop following it. (Before, it was
// stored with none: a gateway adopted it at once, and followed it beside
// the run.)
func TestRunFollowsItsEngineTurn(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rs := &runStore{st: st, rec: store.NewRecorder(st), engine: "temporal"}
	in := agent.Input{Text: "go"}
	if err := rs.begin(ctx, &in, "demo", IO{}); err != nil {
		t.Fatal(err)
	}
	defer rs.unwatch()
	if who, err := st.Follower(ctx, in.TurnID); err != nil || who != st.Owner() {
		t.Errorf("the run's turn is followed by %q (%v), want the run's own store, %q", who, err, st.Owner())
	}
	gateway, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gateway.Close()
	if ids, err := gateway.AdoptTurns(ctx, "temporal", "demo", 10); err != nil || len(ids) != 0 {
		t.Errorf("adopted %v (%v) while the run follows it", ids, err)
	}
}
