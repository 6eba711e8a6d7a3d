package cli_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/internal/mcptest"
	"github.com/timebox-run/timebox/internal/testenv"
)

// TestMain stops the shared PostgreSQL cluster and Temporal dev server,
// then checks that no goroutine outlived the tests (the servers' own
// readers are gone by then).
func TestMain(m *testing.M) {
	if mcptest.Serving() { // the MCP server of TestMCPServeHTTPCancelsAProxiedCall
		mcptest.Serve()
	}
	code := m.Run()
	if binaryDir != "" { // 130 MB a run, left in the temporary directory before
		os.RemoveAll(binaryDir)
	}
	testenv.StopTemporal()
	testenv.StopPostgres()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("os/signal.signal_recv")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
