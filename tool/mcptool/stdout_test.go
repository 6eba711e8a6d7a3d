//go:build linux

package mcptool

import (
	"context"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/mcptest"
)

// openMCPTest starts internal/mcptest's stdio server with env set.
func openMCPTest(t *testing.T, env ...string) (*Server, error) {
	t.Helper()
	noLeftovers(t)
	t.Setenv(mcptest.EnvServe, "1")
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	s, err := Open(context.Background(), Config{Name: "srv", Command: mcptest.Command(), Budget: tb(10*time.Second, 0), KeepAlive: -1})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

// TestStrayStdoutLinesAreLeftOut: a server that prints a banner to stdout
// before it serves, or a log line during a call, is not cut off for it:
// the line is left out, noted in its stderr tail, and the connection goes
// on. (The SDK's parse error closed the server's input: it "exited before
// it was ready (exit status 0)", or "exited during the call".)
func TestStrayStdoutLinesAreLeftOut(t *testing.T) {
	s, err := openMCPTest(t, mcptest.EnvBanner, "Server starting up on stdio...")
	if err != nil {
		t.Fatalf("a server with a banner: %v", err)
	}
	x, _ := call(context.Background(), t, s, "noise", `{}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if got := output(x); got != "after the noise" {
		t.Errorf("noise answered %q", got)
	}
	x, _ = call(context.Background(), t, s, "echo", `{}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if st := s.Stats(); st.Starts != 1 {
		t.Errorf("starts %d: the server was restarted", st.Starts)
	}
	s.mu.Lock()
	tail := s.cur.proc.stderrTail()
	s.mu.Unlock()
	for _, want := range []string{`left out a line on stdout that is not JSON-RPC: "Server starting up on stdio..."`,
		`left out a line on stdout that is not JSON-RPC: "Processing request... done"`} {
		if !strings.Contains(tail, want) {
			t.Errorf("stderr tail %q lacks %q", tail, want)
		}
	}
}

// TestABrokenMessageIsNamed: a line that starts as JSON and is not ends
// the connection (no later message can be trusted), and the call's error
// says so, not that the server exited.
func TestABrokenMessageIsNamed(t *testing.T) {
	s, err := openMCPTest(t)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := call(context.Background(), t, s, "garble", `{}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	if msg := x.Err.Error(); !strings.Contains(msg, `MCP server "srv" wrote a line on stdout that is not a JSON-RPC message (invalid character 'o'`) ||
		!strings.Contains(msg, "during the call") {
		t.Errorf("error %q", msg)
	}
}

// TestLargeMessages: a result past the SDK's 16 MiB frame is read and cut
// to the call's max output; one past MaxMessage fails its call saying so.
func TestLargeMessages(t *testing.T) {
	s, err := openMCPTest(t)
	if err != nil {
		t.Fatal(err)
	}
	// The budget is not under test, only what is read: under -race each
	// side scans every byte, and on a loaded machine the 70 MB message
	// took longer than 30s (timed_out, not the error). Speed belongs in
	// a benchmark.
	const generous = 5 * time.Minute
	x, _ := call(context.Background(), t, s, "big", `{"bytes": 17000000}`, tb(generous, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	if !x.Result.Truncated || len(x.Result.Output) != 1<<20 {
		t.Errorf("17 MB: %d bytes kept, truncated %v", len(x.Result.Output), x.Result.Truncated)
	}
	x, _ = call(context.Background(), t, s, "big", `{"bytes": 70000000}`, tb(generous, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	if msg := x.Err.Error(); !strings.Contains(msg, "wrote a message longer than 64 MiB on stdout, the most timebox reads of one") {
		t.Errorf("70 MB: error %q", msg)
	}
}

// TestJSONLines: what the SDK reads of a server's stdout, and the notes
// of what it does not, however the bytes arrive.
func TestJSONLines(t *testing.T) {
	in := "Starting...\n{\"a\":1}\n  [1,2]\r\n\nlog: ok\n" + strings.Repeat("z", 300) + "\n{\"b\":2}\ntrailing"
	want := "{\"a\":1}\n  [1,2]\r\n\n{\"b\":2}\n"
	wantNotes := []string{`"Starting..."`, `"log: ok"`, `"` + strings.Repeat("z", 200) + `" (301 bytes)`, `"trailing"`}
	for name, r := range map[string]io.Reader{"whole": strings.NewReader(in), "a byte at a time": iotest.OneByteReader(strings.NewReader(in))} {
		var notes []string
		j := newJSONLines(io.NopCloser(r), func(s string) { notes = append(notes, s) })
		b, err := io.ReadAll(j)
		if err != nil || string(b) != want {
			t.Errorf("%s: read %q, %v; want %q", name, b, err, want)
		}
		if len(notes) != len(wantNotes) {
			t.Fatalf("%s: notes %q", name, notes)
		}
		for i, n := range notes {
			if !strings.HasSuffix(n, wantNotes[i]) {
				t.Errorf("%s: note %d %q, want it to end %s", name, i, n, wantNotes[i])
			}
		}
	}
	j := newJSONLines(io.NopCloser(strings.NewReader(`{"a":"`+strings.Repeat("x", 100)+`"}`+"\n")), func(string) {})
	j.max = 50
	if _, err := io.ReadAll(j); err != errMessageTooLong {
		t.Errorf("a line past max: %v", err)
	}
}

// TestAServerThatIgnoresDiscoverStarts: a stdio server that never answers
// a request it does not know, as one written before server/discover does,
// starts at once. (The SDK asked server/discover first and waited for it
// until the start timeout: "did not answer initialize and tools/list
// within 5s".)
func TestAServerThatIgnoresDiscoverStarts(t *testing.T) {
	noLeftovers(t)
	t.Setenv(mcptest.EnvServe, "1")
	t.Setenv(mcptest.EnvOld, "1")
	start := time.Now()
	s, err := Open(context.Background(), Config{Name: "old", Command: mcptest.Command(), Budget: tb(10*time.Second, 0),
		KeepAlive: -1, StartTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("a server that ignores server/discover: %v", err)
	}
	defer s.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the start took %s", took)
	}
	x, _ := call(context.Background(), t, s, "echo", `{}`, tb(10*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
}
