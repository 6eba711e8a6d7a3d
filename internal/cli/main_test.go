package cli_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/internal/testenv"
)

// os/signal's watcher goroutine starts with the first signal.Notify and
// lives as long as the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("os/signal.signal_recv"),
		goleak.Cleanup(func(int) { testenv.StopPostgres() }))
}
