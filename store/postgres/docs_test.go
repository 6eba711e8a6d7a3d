package postgres_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/store/postgres"
)

// TestDocsSayWhenAGatewayIsGone: the pages that say how soon a dead
// gateway's turns are marked interrupted give the window the code has
// (GoneWindow with the default heartbeat), which
// internal/cli.TestTwoServeOnePostgres measures.
func TestDocsSayWhenAGatewayIsGone(t *testing.T) {
	earliest, latest := postgres.GoneWindow(postgres.DefaultHeartbeat)
	want := fmt.Sprintf("%d–%d s after its death", earliest/time.Second, latest/time.Second)
	for _, p := range []string{"../../README.md", "../../docs/RELIABILITY.md", "../../docs/decisions/many-gateways.md"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not say %q", p, want)
		}
	}
}
