package timebox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreStaysLight keeps the layering honest: the budget logic, events,
// the tool and model seams, the turn machine and the turn loop must not
// pull in a provider SDK, the MCP SDK, SQLite, PostgreSQL's driver,
// Temporal, Prometheus, the browser driver or OpenTelemetry's SDK and
// exporters (the core takes OpenTelemetry's API alone, as a library
// should). Those stay behind their own packages.
func TestCoreStaysLight(t *testing.T) {
	core := []string{"./budget", "./event", "./tool", "./model", "./agent", "./config", "./internal/machine"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, core...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"github.com/openai/", "github.com/anthropics/", "github.com/modelcontextprotocol/",
		"modernc.org/sqlite", "github.com/prometheus/", "github.com/chromedp/", "net/http", "go.temporal.io/", "github.com/jackc/",
		"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters/", "go.opentelemetry.io/proto/"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("a core package depends on %s", dep)
			}
		}
	}
}

// TestEnginesStayApart: Temporal's SDK stays in package temporal (and the
// CLI that offers it), PostgreSQL's driver in store/postgres: the server
// and the stores serve every engine and every store without them.
func TestEnginesStayApart(t *testing.T) {
	for pkg, forbidden := range map[string][]string{
		"./server":         {"go.temporal.io/", "github.com/jackc/"},
		"./store":          {"go.temporal.io/", "github.com/jackc/"},
		"./store/sqlite":   {"go.temporal.io/", "github.com/jackc/"},
		"./store/postgres": {"go.temporal.io/"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

// TestLowerLayersDoNotImportHigherOnes: budget knows nothing of tools,
// tools nothing of turns.
func TestLowerLayersDoNotImportHigherOnes(t *testing.T) {
	rules := map[string][]string{
		"./budget": {"/event", "/tool", "/model", "/agent", "/config"},
		"./event":  {"/tool", "/model", "/agent", "/config"},
		"./tool":   {"/model", "/agent", "/config"},
		"./model":  {"/tool", "/agent", "/config"},
		// The turn machine decides; it runs nothing itself.
		"./internal/machine": {"/tool", "/agent", "/config", "/store", "/temporal", "/server"},
	}
	for pkg, bad := range rules {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				if dep == "github.com/timebox-run/timebox"+b {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}
