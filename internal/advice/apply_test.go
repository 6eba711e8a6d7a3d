package advice_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/advice"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// golden compares got with testdata/name, which -update rewrites.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test -run %s -update rewrites it); got:\n%s", path, t.Name(), got)
	}
}

// TestApply edits a real agent file: every kind of place a budget is
// declared, and nothing else of the file changes.
func TestApply(t *testing.T) {
	src, err := os.ReadFile("testdata/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	edits := []advice.Edit{
		{Tool: "web_fetch", Key: "timeout", Value: 10 * s},                                           // quoted, with a comment
		{Tool: "crawl", Key: "timeout", Value: 5 * time.Minute},                                      // added after exec
		{Tool: "crawl", Key: "idle_timeout", Value: 30 * s},                                          // replaced
		{Tool: "search", Key: "timeout", Value: 2 * s},                                               // a flow mapping
		{Tool: "search", Key: "idle_timeout", Value: 500 * time.Millisecond},                         // the same, again
		{Tool: "everything__trigger-long-running-operation", Key: "timeout", Value: 1 * time.Minute}, // an override
		{Tool: "everything__echo", Key: "timeout", Value: 200 * time.Millisecond},                    // a block override
		{Tool: "everything__add", Key: "timeout", Value: time.Second},                                // a new override
		{Tool: "fs__read_file", Key: "timeout", Value: 15 * s},                                       // no overrides yet
		{Tool: "fs__read_file", Key: "idle_timeout", Value: 5 * s},                                   // into the new one
		{Tool: "go_tool", Key: "timeout", Value: s},                                                  // not in the file
	}
	out, skipped, err := advice.Apply(src, edits)
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 1 || !strings.HasPrefix(skipped[0], "go_tool timeout: not declared in the agent file") {
		t.Errorf("skipped: %q", skipped)
	}
	golden(t, "agent.applied.yaml", string(out))
	golden(t, "agent.diff", advice.Diff("agent.yaml", "agent.yaml (suggested)", src, out))

	// Every comment and blank line is still there.
	for _, line := range strings.Split(string(src), "\n") {
		if trimmed := strings.TrimSpace(line); (strings.HasPrefix(trimmed, "#") || trimmed == "") && !strings.Contains(string(out), line+"\n") {
			t.Errorf("lost the line %q", line)
		}
	}
	// Applying the same again changes nothing.
	again, _, err := advice.Apply(out, edits)
	if err != nil || string(again) != string(out) {
		t.Errorf("a second Apply changed the file:\n%s", advice.Diff("once", "twice", out, again))
	}
}

// TestApplyCRLF: a file with Windows line endings is edited as the same
// file with LF ones, and keeps its CRLF.
func TestApplyCRLF(t *testing.T) {
	src, err := os.ReadFile("testdata/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/agent.applied.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crlf := func(b []byte) []byte { return []byte(strings.ReplaceAll(string(b), "\n", "\r\n")) }
	s := time.Second
	edits := []advice.Edit{
		{Tool: "web_fetch", Key: "timeout", Value: 10 * s},
		{Tool: "crawl", Key: "timeout", Value: 5 * time.Minute},
		{Tool: "crawl", Key: "idle_timeout", Value: 30 * s},
		{Tool: "search", Key: "timeout", Value: 2 * s},
		{Tool: "search", Key: "idle_timeout", Value: 500 * time.Millisecond},
		{Tool: "everything__trigger-long-running-operation", Key: "timeout", Value: 1 * time.Minute},
		{Tool: "everything__echo", Key: "timeout", Value: 200 * time.Millisecond},
		{Tool: "everything__add", Key: "timeout", Value: time.Second},
		{Tool: "fs__read_file", Key: "timeout", Value: 15 * s},
		{Tool: "fs__read_file", Key: "idle_timeout", Value: 5 * s},
	}
	out, skipped, err := advice.Apply(crlf(src), edits)
	if err != nil || len(skipped) != 0 {
		t.Fatalf("skipped %q, err %v", skipped, err)
	}
	if string(out) != string(crlf(want)) {
		t.Errorf("the CRLF file was edited otherwise:\n%s", advice.Diff("LF, CRLF'd", "CRLF", crlf(want), out))
	}
}
