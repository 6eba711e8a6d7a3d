// Command stream measures how a turn ends against a model that never stops
// streaming (issue 9): how long past `timeouts.turn` the turn and the
// process end, the peak memory of the timebox process, and how much of the
// reply was kept. Each scenario plays an endless stream from a fake
// provider (internal/fakellm, the real OpenAI or Anthropic SSE wire format)
// to a child `timebox run` (with and without the store, as the live view
// and as --json) or `timebox serve` (alone, and with 20 followers of the
// turn's events that never read), and prints one table row:
//
//	go run ./bench/stream                      # every scenario, turn 4s
//	go run ./bench/stream -turn 4s -run flood  # the scenarios whose name contains "flood"
//
// The peak memory of a child is its VmHWM (peak resident set size, sampled
// from /proc every 10ms by internal/procmem; getrusage's maxrss of a child
// also counts the parent it was forked from), which includes the Go runtime
// and the binary itself.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/procmem"
)

// scenario is one misbehaving model.
type scenario struct {
	name   string
	format fakellm.Format
	reply  fakellm.Reply
	// maxReply, when set, is given as --max-reply.
	maxReply string
	// long is the reply's length of a long-reply scenario: its peak memory
	// goes into the fit of peak against reply (fitLong).
	long int
}

func scenarios() []scenario {
	big := strings.Repeat("all work and no play makes jack a dull boy ", (256<<10)/43+1)[:256<<10]
	return []scenario{
		{name: "flood: 256 KiB text chunks, endless (openai)", format: fakellm.OpenAI,
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: big}}}},
		{name: "flood: 256 KiB text chunks, endless, --max-reply 16MiB (openai)", format: fakellm.OpenAI, maxReply: "16MiB",
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: big}}}},
		{name: "flood: 256 KiB text chunks, endless (anthropic)", format: fakellm.Anthropic,
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: big}}}},
		{name: "flood: 4 KiB tool-call argument fragments, endless (openai)", format: fakellm.OpenAI,
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{
				{Tool: &fakellm.ToolFragment{ID: "call_1", Name: "echo"}},
				{Tool: &fakellm.ToolFragment{Arguments: big[:4<<10]}}}}},
		{name: "flood: 1-byte chunks, endless (openai)", format: fakellm.OpenAI,
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: "x"}}}},
		{name: "long: a 15 MB reply in 1 KiB chunks, --max-reply 16MiB (openai)", format: fakellm.OpenAI, maxReply: "16MiB",
			reply: fakellm.Reply{Chunks: longReply(15<<20/1024, big[:1024])}, long: 15 << 20},
		// The base the long reply is measured against: the same provider
		// and modes, a reply of one chunk.
		{name: "long's base: a 1 KiB reply, --max-reply 16MiB (openai)", format: fakellm.OpenAI, maxReply: "16MiB",
			reply: fakellm.Reply{Chunks: longReply(1, big[:1024])}, long: 1 << 10},
		// Two lengths between, for the fit of peak memory against the
		// reply's length: its slope is what a byte of reply costs, whatever
		// the process's base (its binary's pages touched vary by run).
		{name: "long: a 5 MB reply in 1 KiB chunks, --max-reply 16MiB (openai)", format: fakellm.OpenAI, maxReply: "16MiB",
			reply: fakellm.Reply{Chunks: longReply(5<<20/1024, big[:1024])}, long: 5 << 20},
		{name: "long: a 10 MB reply in 1 KiB chunks, --max-reply 16MiB (openai)", format: fakellm.OpenAI, maxReply: "16MiB",
			reply: fakellm.Reply{Chunks: longReply(10<<20/1024, big[:1024])}, long: 10 << 20},
		{name: "trickle: a 1-byte chunk every 10ms, endless (openai)", format: fakellm.OpenAI,
			reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: "x", Delay: 10 * time.Millisecond}}}},
		{name: "trickle: one event, a byte every 5ms (openai)", format: fakellm.OpenAI,
			reply: fakellm.Reply{ByteDelay: 5 * time.Millisecond, Chunks: []fakellm.Chunk{{Text: big}}}},
	}
}

// longReply is a reply of n chunks of text c: one that ends, under
// max_reply, but long (issue 29: what a long reply costs in memory).
func longReply(n int, c string) []fakellm.Chunk {
	chunks := make([]fakellm.Chunk, n)
	for i := range chunks {
		chunks[i] = fakellm.Chunk{Text: c}
	}
	return chunks
}

// mode is how timebox is run.
type mode struct {
	name  string
	serve bool
	idle  int      // serve: followers of the turn's events that never read
	args  []string // for run
}

var modes = []mode{
	{name: "run, view, no store", args: []string{"--no-store"}},
	{name: "run --json, no store", args: []string{"--json", "--no-store"}},
	{name: "run, view, store", args: nil},
	{name: "serve, memory store", serve: true},
	{name: "serve, 20 followers that do not read", serve: true, idle: 20},
}

// result is one measured row.
type result struct {
	stopReason string
	turnWall   time.Duration // the turn's own wall time (its record), or 0 when not known
	exited     time.Duration // from start to the process's exit (run) or to the reply (serve)
	peakRSS    int64         // bytes
	answer     int           // bytes of answer kept
	err        error
}

func main() {
	turn := flag.Duration("turn", 4*time.Second, "timeouts.turn of every scenario")
	bin := flag.String("timebox", "", "the timebox binary (default: built from ./cmd/timebox)")
	only := flag.String("run", "", "only the scenarios whose name contains this")
	onlyMode := flag.String("mode", "", "only the modes whose name contains this")
	serveOnly := flag.Bool("serve", false, "only serve the first chosen scenario's fake provider and print its base URL, until interrupted (to try timebox by hand)")
	flag.Parse()
	if *serveOnly {
		for _, sc := range scenarios() {
			if strings.Contains(sc.name, *only) {
				srv := fakellm.New(sc.format, sc.reply)
				fmt.Printf("%s\n%s base_url: %s\n", sc.name, sc.format, srv.BaseURL())
				sig := make(chan os.Signal, 1)
				signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
				<-sig
				srv.Close()
				return
			}
		}
		fatal(fmt.Errorf("no scenario matches %q", *only))
	}

	dir, err := os.MkdirTemp("", "timebox-bench-stream-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "timebox")
		build := exec.Command("go", "build", "-o", *bin, "./cmd/timebox")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fatal(fmt.Errorf("building timebox: %w", err))
		}
	}
	fmt.Printf("timeouts.turn %s; peak RSS is the timebox process's VmHWM\n\n", *turn)
	fmt.Println("| scenario | timebox | stop reason | turn ended (past the budget) | process exited / replied | peak RSS | answer kept |")
	fmt.Println("|---|---|---|---|---|---|---|")
	points := map[string][][2]float64{} // mode → (reply, peak) of the long replies
	for _, sc := range scenarios() {
		if !strings.Contains(sc.name, *only) {
			continue
		}
		for _, m := range modes {
			if !strings.Contains(m.name, *onlyMode) {
				continue
			}
			r := measure(*bin, dir, *turn, sc, m)
			if r.err != nil {
				fmt.Printf("| %s | %s | error: %v | | | | |\n", sc.name, m.name, r.err)
				continue
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %.0f MB | %s |\n", sc.name, m.name, r.stopReason,
				fmtWall(r.turnWall, *turn), fmtWall(r.exited, *turn), float64(r.peakRSS)/1e6, fmtBytes(r.answer))
			if sc.long > 0 {
				points[m.name] = append(points[m.name], [2]float64{float64(sc.long), float64(r.peakRSS)})
			}
		}
	}
	fitLong(points)
}

// fitLong prints, for each mode with long replies of three lengths or
// more, the least-squares line of peak memory against the reply's length:
// its slope is the peak's bytes a byte of reply (issue 29's goal: ≤ 3),
// its intercept the fixed base. It fits again over the replies of 1 MiB
// or more: a cache that fills up to a fixed size within the first
// megabytes (SQLite's pages) is part of the base, not of a byte's cost,
// but the fit from 1 KiB counts it in the slope.
func fitLong(points map[string][][2]float64) {
	first := true
	for _, m := range modes {
		ps := points[m.name]
		if len(ps) < 3 {
			continue
		}
		if first {
			fmt.Println("\n| timebox | peak a byte of reply (the fit's slope) | base (its intercept) | replies | slope over replies of 1 MiB or more |")
			fmt.Println("|---|---|---|---|---|")
			first = false
		}
		slope, base := fit(ps)
		var long [][2]float64
		for _, p := range ps {
			if p[0] >= 1<<20 {
				long = append(long, p)
			}
		}
		longSlope := "—"
		if len(long) >= 2 && len(long) < len(ps) {
			s, _ := fit(long)
			longSlope = fmt.Sprintf("%.2f (%d)", s, len(long))
		}
		fmt.Printf("| %s | %.2f | %.0f MB | %d | %s |\n", m.name, slope, base/1e6, len(ps), longSlope)
	}
}

// fit returns the least-squares line through ps.
func fit(ps [][2]float64) (slope, intercept float64) {
	var n, sx, sy, sxx, sxy float64
	for _, p := range ps {
		n, sx, sy, sxx, sxy = n+1, sx+p[0], sy+p[1], sxx+p[0]*p[0], sxy+p[0]*p[1]
	}
	slope = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	return slope, (sy - slope*sx) / n
}

// fmtWall renders a time from the start, and how far past the budget it
// was when it was.
func fmtWall(d, budget time.Duration) string {
	if d == 0 {
		return "—"
	}
	s := fmt.Sprintf("%.2fs", d.Seconds())
	if d > budget {
		s += fmt.Sprintf(" (+%d ms)", (d - budget).Milliseconds())
	}
	return s
}

func fmtBytes(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	if n >= 1<<10 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench/stream:", err)
	os.Exit(1)
}

// measure runs one scenario in one mode.
func measure(bin, dir string, turn time.Duration, sc scenario, m mode) result {
	srv := fakellm.New(sc.format, sc.reply)
	defer srv.Close()
	prov := string(sc.format)
	file := filepath.Join(dir, "agent.yaml")
	agent := fmt.Sprintf(`model: {primary: "%s:endless"}
providers: {%s: {base_url: %q, credentials: [{api_key_env: FAKE_KEY}]}}
tools:
  - {name: echo, description: Echoes., exec: [cat]}
`, prov, prov, srv.BaseURL())
	if err := os.WriteFile(file, []byte(agent), 0o644); err != nil {
		return result{err: err}
	}
	env := append(os.Environ(), "FAKE_KEY=k", "TIMEBOX_TURN_TIMEOUT="+turn.String())
	if sc.maxReply != "" {
		env = append(env, "TIMEBOX_MAX_REPLY="+sc.maxReply)
	}
	if m.serve {
		return measureServe(bin, file, env, m.idle)
	}
	return measureRun(bin, dir, file, env, m)
}

func measureRun(bin, dir, file string, env []string, m mode) result {
	args := append([]string{"run", "-f", file, "--db", filepath.Join(dir, "runs.db")}, m.args...)
	args = append(args, "Go on for ever.")
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		return result{err: err}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return result{err: err}
	}
	peak := procmem.Watch(cmd.Process.Pid)
	fin := readFinished(out)
	werr := cmd.Wait()
	r := result{exited: time.Since(start), peakRSS: peak()}
	if ee, ok := werr.(*exec.ExitError); werr != nil && (!ok || ee.ExitCode() == 1 || ee.ExitCode() == 2) {
		return result{err: fmt.Errorf("%v: %s", werr, lastLine(stderr.String()))}
	}
	r.stopReason = fin.StopReason
	if fin.found {
		r.turnWall = time.Duration(fin.Totals.WallMS) * time.Millisecond
		r.answer = len(fin.Answer)
	}
	return r
}

// finished is what the bench reads of turn_finished (from --json lines, or
// a record served over HTTP).
type finished struct {
	found      bool
	StopReason string `json:"stop_reason"`
	Answer     string `json:"answer"`
	WallMS     int64  `json:"wall_ms"`
	Totals     struct {
		WallMS int64 `json:"wall_ms"`
	} `json:"totals"`
}

// bannerRE finds the stop reason in the live view's closing banner.
var bannerRE = regexp.MustCompile(`^(?:■ stopped|✗ failed|⊘ cancelled) \((\w+)\)`)

// readFinished reads a child's stdout to its end, keeping only the
// turn_finished line of --json output, or the stop reason of the view's
// banner.
func readFinished(r io.Reader) finished {
	var f finished
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	keep := false
	first := true
	for {
		frag, isPrefix, err := br.ReadLine()
		if first {
			keep = bytes.Contains(frag[:min(len(frag), 200)], []byte(`"type":"turn_finished"`))
			if m := bannerRE.FindSubmatch(frag[:min(len(frag), 200)]); m != nil {
				f.StopReason = string(m[1])
			}
		}
		if keep {
			line = append(line, frag...)
		}
		first = !isPrefix
		if !isPrefix {
			if keep && json.Unmarshal(line, &f) == nil {
				f.found = true
			}
			line, keep = line[:0], false
		}
		if err != nil {
			return f
		}
	}
}

func measureServe(bin, file string, env []string, idle int) result {
	cmd := exec.Command(bin, "serve", "-f", file, "--addr", "127.0.0.1:0", "--db", "")
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		return result{err: err}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return result{err: err}
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	var base string
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), " on http://"); ok {
			base = "http://" + strings.Fields(after)[0]
			break
		}
	}
	go io.Copy(io.Discard, out)
	if base == "" {
		return result{err: fmt.Errorf("serve did not start: %s", lastLine(stderr.String()))}
	}
	start := time.Now()
	resp, err := http.Post(base+"/v1/turns", "application/json", strings.NewReader(`{"input": "Go on for ever."}`))
	if err != nil {
		return result{err: err}
	}
	// Followers of the turn's events that never read: each falls behind,
	// is cut loose from the live fan-out and catches up from the store.
	var followers []*http.Response
	defer func() {
		for _, r := range followers {
			r.Body.Close()
		}
	}()
	for range idle {
		r, err := http.Get(base + "/v1/turns/" + resp.Header.Get("Timebox-Turn-Id") + "/events?after=0")
		if err != nil {
			return result{err: err}
		}
		followers = append(followers, r)
	}
	var f finished
	err = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	replied := time.Since(start)
	if err != nil {
		return result{err: fmt.Errorf("reading the record: %w", err)}
	}
	return result{stopReason: f.StopReason, turnWall: time.Duration(f.WallMS) * time.Millisecond,
		exited: replied, answer: len(f.Answer), peakRSS: procmem.Peak(cmd.Process.Pid)}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
