//go:build faults && linux

package faults

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/internal/floodtest"
	"github.com/timebox-run/timebox/internal/mcptest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/testenv"
)

var reportFile = flag.String("faults.report", "", "write the measured figures, as a Markdown table, to this file")

// started is when the suite started, for the report's header.
var started = time.Now()

func TestMain(m *testing.M) {
	if mcptest.Serving() { // the MCP server of mcpIgnoredCancel is this binary
		mcptest.Serve()
	}
	floodtest.Main() // the flooding program of the progress flood is this binary
	load := loadAverage()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		// The idle cgroups of the in-process scenarios, now rather than
		// left for the next timebox process.
		proctree.Close()
		testenv.StopPostgres()
		if *reportFile != "" {
			if err := writeReport(*reportFile, load, loadAverage()); err != nil {
				fmt.Fprintln(os.Stderr, "faults: writing the report:", err)
				code = max(code, 1)
			}
		}
		if dir := binDir(); dir != "" {
			os.RemoveAll(dir)
		}
		os.Exit(code)
	}))
}

// TestFaults runs the scenarios one after another, never two at once:
// each measures time and memory, and the leak check counts every process
// of the test. Select some with -run, as TestFaults/stream or
// TestFaults/kill.
func TestFaults(t *testing.T) {
	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"endless stream", endlessStream},
		{"endless stream, library", endlessStreamLibrary},
		{"slow reader of a reply", slowReaderOfAReply},
		{"long reply", longReply},
		{"long reply, idle followers", longReplyIdleFollowers},
		{"idle followers", idleFollowers},
		{"many calls", manyCalls},
		{"progress flood", progressFlood},
		{"output", outputFloods},
		{"process trees", processTrees},
		{"tool on timebox's terminal", toolOnTerminal},
		{"burst", burst},
		{"wind-down", windDown},
		{"wind-down, stored", windDownStored},
		{"client gone", clientGone},
		{"SIGTERM serve", sigtermServe},
		{"SIGTERM run", sigtermRun},
		{"kill -9 then restart", kill9ThenRestart},
		{"reader of stdout gone", readerGoesAway},
		{"MCP server ignoring a cancel", mcpIgnoredCancel},
		{"MCP server busy without answering pings", mcpBusyServer},
		{"serve restarted while a call waits for a person", serveRestartWhileApproving},
	} {
		t.Run(s.name, s.run)
	}
}

var (
	binMu   sync.Mutex
	binPath string
	binErr  error
	binTook time.Duration
)

// binary returns the timebox binary, built from ./cmd/timebox by the first
// scenario that needs it. The build is not a scenario's time.
func binary(t *testing.T) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if binPath == "" && binErr == nil {
		dir, err := os.MkdirTemp("", "timebox-faults-")
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "timebox")
		start := time.Now()
		out, err := exec.Command("go", "build", "-o", bin, "../../cmd/timebox").CombinedOutput()
		binTook = time.Since(start)
		if err != nil {
			os.RemoveAll(dir)
			binErr = fmt.Errorf("building timebox: %v\n%s", err, out)
		} else {
			binPath = bin
		}
	}
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func binDir() string {
	binMu.Lock()
	defer binMu.Unlock()
	if binPath == "" {
		return ""
	}
	return filepath.Dir(binPath)
}

// loadAverage returns /proc/loadavg's three averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// A row is one figure of one scenario.
type row struct {
	scenario, via, figure, bound, measured string
	kind                                   kind
	ok                                     bool
}

// kind sorts figures into the columns of the report's summary.
type kind int

const (
	kindOther kind = iota
	kindLeft       // processes left, goroutines above the baseline
	kindLost       // records lost
	kindPeak       // the peak memory of timebox
	kindTime       // a time against its deadline
)

var (
	rowsMu sync.Mutex
	rows   []row
)

// scenario records the figures of one scenario: each is asserted against
// its bound (a failure is an Errorf, so that the scenario's other figures
// are still measured) and kept for the report.
type scenario struct {
	t         *testing.T
	name, via string
}

// begin starts a scenario of t: name is what it does, via how timebox is
// run (`timebox run --json`, the library, ...).
func begin(t *testing.T, name, via string) *scenario {
	t.Helper()
	t.Logf("scenario %q via %s", name, via)
	return &scenario{t: t, name: name, via: via}
}

func (s *scenario) add(figure, bound, measured string, ok bool) {
	s.t.Helper()
	s.addKind(kindOther, figure, bound, measured, ok)
}

func (s *scenario) addKind(k kind, figure, bound, measured string, ok bool) {
	s.t.Helper()
	rowsMu.Lock()
	rows = append(rows, row{s.name, s.via, figure, bound, measured, k, ok})
	rowsMu.Unlock()
	if ok {
		s.t.Logf("%s: %s (bound %s)", figure, measured, bound)
	} else {
		s.t.Errorf("%s: %s, out of its bound %s", figure, measured, bound)
	}
}

// count asserts got == want.
func (s *scenario) count(figure string, got, want int) {
	s.t.Helper()
	s.add(figure, fmt.Sprintf("= %d", want), fmt.Sprint(got), got == want)
}

// atMost asserts got <= bound, for a count.
func (s *scenario) atMost(figure string, got, bound int) {
	s.t.Helper()
	s.add(figure, fmt.Sprintf("≤ %d", bound), fmt.Sprint(got), got <= bound)
}

// is asserts a word: a stop reason, an outcome.
func (s *scenario) is(figure string, got, want string) {
	s.t.Helper()
	s.add(figure, want, got, got == want)
}

// within asserts a duration: got <= bound.
func (s *scenario) within(figure string, got, bound time.Duration) {
	s.t.Helper()
	s.addKind(kindTime, figure, "≤ "+ms(bound), ms(got), got <= bound)
}

// memory asserts a peak memory, in bytes, under boundMB megabytes (10^6).
// A peak of 0 means it could not be read, which fails.
func (s *scenario) memory(figure string, got int64, boundMB int) {
	s.t.Helper()
	s.addKind(kindPeak, figure, fmt.Sprintf("< %d MB", boundMB), megabytes(got), got > 0 && got < int64(boundMB)*1e6)
}

// size asserts a number of bytes under boundMB megabytes.
func (s *scenario) size(figure string, got int64, boundMB int) {
	s.t.Helper()
	s.add(figure, fmt.Sprintf("< %d MB", boundMB), megabytes(got), got < int64(boundMB)*1e6)
}

func megabytes(n int64) string {
	if n < 10e6 {
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.0f MB", float64(n)/1e6)
}

// ratio asserts got < bound.
func (s *scenario) ratio(figure string, got, bound float64) {
	s.t.Helper()
	s.add(figure, fmt.Sprintf("< %.1f×", bound), fmt.Sprintf("%.2f×", got), got < bound)
}

// truth asserts a condition that has no number, described by measured.
func (s *scenario) truth(figure, bound, measured string, ok bool) {
	s.t.Helper()
	s.add(figure, bound, measured, ok)
}

// ms renders a duration in milliseconds, or seconds from 10s on.
func ms(d time.Duration) string {
	if d >= 10*time.Second || d <= -10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// writeReport writes the figures measured so far as a Markdown table.
func writeReport(path, loadBefore, loadAfter string) error {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	var b strings.Builder
	host, _ := os.Hostname()
	strategy, err := proctree.Resolve(proctree.Auto)
	if err != nil {
		strategy = proctree.Strategy("none: " + err.Error())
	}
	fmt.Fprintf(&b, "Fault suite, %s on %s/%s, %d CPUs, %s (host %s); process trees: %s by default.\n",
		started.Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), host, strategy)
	fmt.Fprintf(&b, "Load average (1, 5, 15 min) before: %s; after: %s. Suite: %s, of which building timebox %s.\n\n",
		loadBefore, loadAfter, time.Since(started).Round(time.Second), binTook.Round(time.Second))
	summary(&b)
	b.WriteString("\nEvery figure:\n\n| scenario | via | figure | bound | measured | |\n|---|---|---|---|---|---|\n")
	last := ""
	for _, r := range rows {
		name, via := r.scenario, r.via
		if name+via == last {
			name, via = "", ""
		} else {
			last = name + via
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", name, via, r.figure, r.bound, r.measured, r.mark())
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func (r row) mark() string {
	if !r.ok {
		return "✗"
	}
	return "✓"
}

// summary writes one line per scenario: the figures every scenario has in
// columns of their own, the others together, each as "measured (bound)".
func summary(b *strings.Builder) {
	b.WriteString("| scenario | via | processes left | records lost | peak memory of timebox | time | other figures | |\n|---|---|---|---|---|---|---|---|\n")
	type line struct {
		scenario, via string
		cols          [5][]string
		mark          string
	}
	var lines []*line
	for _, r := range rows {
		if len(lines) == 0 || lines[len(lines)-1].scenario != r.scenario || lines[len(lines)-1].via != r.via {
			lines = append(lines, &line{scenario: r.scenario, via: r.via, mark: "✓"})
		}
		l := lines[len(lines)-1]
		var cell string
		switch r.kind {
		case kindLeft, kindLost:
			cell = r.measured
			if r.figure != "processes left" && r.figure != "records lost" {
				cell = r.figure + " " + r.measured
			}
		case kindPeak:
			cell = r.measured + " (" + r.bound + ")"
		case kindTime:
			cell = r.figure + " " + r.measured + " (" + r.bound + ")"
		default:
			cell = r.figure + " " + r.measured
			if !r.ok || (r.bound != r.measured && r.bound != "= "+r.measured) {
				cell += " (" + r.bound + ")"
			}
		}
		if !r.ok {
			cell += " ✗"
		}
		if r.figure == "processes left" {
			l.cols[r.kind] = append([]string{cell}, l.cols[r.kind]...)
		} else {
			l.cols[r.kind] = append(l.cols[r.kind], cell)
		}
		if m := r.mark(); m != "✓" && l.mark != "✗" {
			l.mark = m
		}
	}
	for _, l := range lines {
		col := func(k kind) string {
			if len(l.cols[k]) == 0 {
				return "—"
			}
			return strings.Join(l.cols[k], "; ")
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", l.scenario, l.via, col(kindLeft), col(kindLost), col(kindPeak), col(kindTime), col(kindOther), l.mark)
	}
}
