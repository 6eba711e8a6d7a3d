// Command peers runs the same tool-budget scenarios through timebox (an
// exec tool, and an MCP tool) and through its peers — @openai/agents, the
// Vercel ai package and the MCP TypeScript SDK (peers.mjs) — and the MCP
// TypeScript SDK's client calling the same MCP tools through `timebox mcp
// serve` (as is, and with on_ignored_cancel: restart) in one run, and
// prints the table of docs/BENCHMARKS.md (## Peers side by side):
//
//	go run ./bench/peers            # runs npm ci in bench/peers first if needed
//
// The scenarios (work.mjs; the exec scripts below do the same in sh): a
// tool hung past a 1s budget that honours its cancellation, one that
// ignores it, and one that reports progress for 1s and then goes silent.
// The tool's work is a real process (sleep 10) whose pid the harness
// checks when the caller gets control back and 500ms later. It reads /proc,
// so it runs on Linux only.
//
//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// round is one measured call, as peers.mjs prints it.
type round struct {
	System          string `json:"system"`
	Scenario        string `json:"scenario"`
	Round           int    `json:"round"`
	AfterMS         int64  `json:"after_ms"`
	Told            string `json:"told"`
	RunningAtReturn bool   `json:"running_at_return"`
	Running500ms    bool   `json:"running_500ms"`
}

var scenarios = []string{"hung", "ignore", "silent"}

// budgetMS is when each scenario's budget fires, as peers.mjs counts it:
// 1s; for the silent tool, 1s of progress then 1s of silence.
var budgetMS = map[string]int64{"hung": 1000, "ignore": 1000, "silent": 2000}

// agentFile runs each scenario as an exec tool and, through server.mjs, as
// an MCP tool: 1s timeouts; the silent tool 1s idle within 10s.
const agentFile = `name: peers
model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 1s}
tools:
  - name: hung
    exec: [sh, -c, 'echo $$ > "$PEERS_DIR/x-hung.pid"; exec sleep 10']
    timeout: 1s
  - name: ignore
    exec: [sh, -c, 'trap "" TERM; echo $$ > "$PEERS_DIR/x-ignore.pid"; sleep 10; echo done']
    timeout: 1s
  - name: silent
    exec: [sh, -c, 'for i in 1 2 3 4 5; do sleep 0.2; echo "::progress:: {\"progress\": $i, \"total\": 10}" >&2; done; echo $$ > "$PEERS_DIR/x-silent.pid"; exec sleep 10']
    timeout: 10s
    idle_timeout: 1s
  - name: mcp
    mcp: {command: [node, %[1]q]}
    timeout: 1s
    overrides:
      silent: {timeout: 10s, idle_timeout: 1s}
  - name: mcpr
    mcp: {command: [node, %[1]q], on_ignored_cancel: restart}
    timeout: 1s
    overrides:
      silent: {timeout: 10s, idle_timeout: 1s}
`

func main() {
	rounds := flag.Int("rounds", 5, "rounds of each scenario")
	flag.Parse()
	_, file, _, _ := runtime.Caller(0)
	here := filepath.Dir(file)
	if _, err := os.Stat(filepath.Join(here, "node_modules")); err != nil {
		run(here, "npm", "ci", "--no-audit", "--no-fund")
	}
	dir, err := os.MkdirTemp("", "tb-peers-")
	check(err)
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "timebox")
	run(filepath.Join(here, "..", ".."), "go", "build", "-o", bin, "./cmd/timebox")
	check(os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "unused"}`+"\n"), 0o644))
	check(os.WriteFile(filepath.Join(dir, "agent.yaml"), fmt.Appendf(nil, agentFile, filepath.Join(here, "server.mjs")), 0o644))

	var all []round
	for _, sys := range []struct{ name, prefix, pid string }{
		{"timebox (exec)", "", "x-"}, {"timebox (MCP)", "mcp__", ""},
	} {
		for _, sc := range scenarios {
			for r := 1; r <= *rounds; r++ {
				all = append(all, timeboxRound(bin, dir, sys.name, sys.prefix+sc, sc, filepath.Join(dir, sys.pid+sc+".pid"), r))
			}
		}
	}
	cmd := exec.Command("node", filepath.Join(here, "peers.mjs"), strconv.Itoa(*rounds))
	// The MCP client's rows through timebox mcp serve (peers.mjs).
	cmd.Env = append(os.Environ(), "TB_BIN="+bin, "TB_AGENT="+filepath.Join(dir, "agent.yaml"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	check(err)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r round
		check(json.Unmarshal(sc.Bytes(), &r))
		all = append(all, r)
	}
	table(all, *rounds)
}

// timeboxRound runs one `timebox tool call` and measures it as peers.mjs
// measures a peer: from the call's start (its record's started_at) to when
// the command has the call's result, less the budget. The MCP server is
// closed when the command exits, after that.
func timeboxRound(bin, dir, system, toolName, scenario, pidfile string, n int) round {
	os.Remove(pidfile)
	cmd := exec.Command(bin, "tool", "call", toolName, "--input", "{}", "-f", filepath.Join(dir, "agent.yaml"))
	cmd.Env = append(os.Environ(), "PEERS_DIR="+dir)
	var out bytes.Buffer
	cmd.Stdout = &out
	errPipe, err := cmd.StderrPipe()
	check(err)
	check(cmd.Start())
	// The live view's line for the call's end ("⏱ hung 1.0s / 1s timed
	// out: …") is written when the caller — the turn, here the command —
	// has the call's result: that is when it has control back.
	var (
		back     time.Time
		pid      int
		atReturn bool
	)
	sc := bufio.NewScanner(errPipe)
	for sc.Scan() {
		if back.IsZero() && strings.HasPrefix(sc.Text(), "⏱") {
			back = time.Now()
			pid = readPid(pidfile)
			atReturn = alive(pid)
		}
	}
	cmd.Wait() // exit 1 or 3 for a stopped call
	if back.IsZero() {
		back = time.Now()
		pid = readPid(pidfile)
		atReturn = alive(pid)
	}
	time.Sleep(time.Until(back.Add(500 * time.Millisecond)))
	later := alive(pid)
	if later {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	var rec struct {
		StartedAt time.Time `json:"started_at"`
		Outcome   string    `json:"outcome"`
		Phase     string    `json:"phase"`
		Result    string    `json:"result"`
	}
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: no record: %v\n%s\n", system, scenario, err, out.String())
		os.Exit(1)
	}
	var res struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	told := rec.Result
	if json.Unmarshal([]byte(rec.Result), &res) == nil && res.Error.Type != "" {
		told = res.Error.Type + ": " + res.Error.Message
	}
	if len(told) > 120 {
		told = told[:120]
	}
	return round{System: system, Scenario: scenario, Round: n, Told: told, RunningAtReturn: atReturn, Running500ms: later,
		AfterMS: back.Sub(rec.StartedAt).Milliseconds() - budgetMS[scenario]}
}

// table prints one row per system and scenario.
func table(all []round, rounds int) {
	fmt.Printf("| system | scenario | control back after the budget (min / median / max, %d rounds) | told | work running at return | 500ms later |\n", rounds)
	fmt.Println("|---|---|---|---|---|---|")
	var order []string
	groups := map[string][]round{}
	for _, r := range all {
		k := r.System + "\x00" + r.Scenario
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	for _, k := range order {
		g := groups[k]
		var ms []int64
		atReturn, later := 0, 0
		for _, r := range g {
			ms = append(ms, r.AfterMS)
			if r.RunningAtReturn {
				atReturn++
			}
			if r.Running500ms {
				later++
			}
		}
		slices.Sort(ms)
		fmt.Printf("| %s | %s | %s / %s / %s | %s | %d of %d | %d of %d |\n", g[0].System, title[g[0].Scenario],
			human(ms[0]), human(ms[len(ms)/2]), human(ms[len(ms)-1]), strings.ReplaceAll(g[0].Told, "|", "\\|"),
			atReturn, len(g), later, len(g))
	}
}

var title = map[string]string{
	"hung":   "hung past 1s",
	"ignore": "ignores its cancellation",
	"silent": "progress, then silent",
}

func human(ms int64) string {
	if ms >= 10000 || ms <= -10000 {
		return fmt.Sprintf("%.1fs", float64(ms)/1000)
	}
	return fmt.Sprintf("%dms", ms)
}

func readPid(path string) int {
	b, _ := os.ReadFile(path)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie is gone for every purpose here.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func run(dir, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, os.Stderr, os.Stderr
	check(cmd.Run())
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
