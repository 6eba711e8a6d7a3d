// Command mcp measures MCP tool-call budgets side by side: the same timeout
// scenarios run through the reference TypeScript client
// (@modelcontextprotocol/sdk, ts-client.mjs) and through timebox
// (tool/mcptool under tool.Run, as a turn runs it), each against its own
// server-everything behind the same wiretap (wiretap.mjs), which timestamps
// every message at the server's door. It prints the table of
// docs/BENCHMARKS.md (## MCP):
//
//	npm ci --prefix bench/mcp && go run ./bench/mcp
//
// It takes about a minute: after each stop it waits for the server's late
// messages, to count what each client does with them.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/mcptool"
)

const longOp = "trigger-long-running-operation"

// scenario is one measured situation. The JSON part goes to ts-client.mjs;
// both clients get the same limits, each in its own client's terms.
type scenario struct {
	Name     string         `json:"name"`
	Tool     string         `json:"tool"`
	Args     map[string]any `json:"args"`
	Repeat   int            `json:"repeat,omitempty"`
	CancelMS int            `json:"cancel_ms,omitempty"` // the user cancels at this time
	LingerMS int            `json:"linger_ms"`           // wait for late messages before closing
	TS       tsOptions      `json:"ts"`

	title   string        // for the table
	limit   string        // the configured limit, for the table
	timeout time.Duration // timebox's timeout
	idle    time.Duration // timebox's idle_timeout (0: off)
}

// tsOptions are the TypeScript client's RequestOptions: timeout (reset by
// each progress notification when reset_on_progress) and maxTotalTimeout.
type tsOptions struct {
	TimeoutMS  int  `json:"timeout_ms"`
	Reset      bool `json:"reset_on_progress"`
	MaxTotalMS int  `json:"max_total_ms,omitempty"`
}

func op(duration float64, steps int) map[string]any {
	return map[string]any{"duration": duration, "steps": steps}
}

var scenarios = []scenario{
	{Name: "cap-no-progress", title: "absolute cap, no progress before 2.5s", limit: "1s total",
		Tool: longOp, Args: op(5, 2), LingerMS: 4500,
		TS:      tsOptions{TimeoutMS: 60000, Reset: true, MaxTotalMS: 1000},
		timeout: time.Second},
	{Name: "cap-with-progress", title: "absolute cap, progress every 1s", limit: "3.5s total, 2s idle",
		Tool: longOp, Args: op(6, 6), LingerMS: 3000,
		TS:      tsOptions{TimeoutMS: 2000, Reset: true, MaxTotalMS: 3500},
		timeout: 3500 * time.Millisecond, idle: 2 * time.Second},
	{Name: "idle", title: "idle limit, progress every 2s", limit: "1s idle, 10s total",
		Tool: longOp, Args: op(4, 2), LingerMS: 3500,
		TS:      tsOptions{TimeoutMS: 1000, Reset: true, MaxTotalMS: 10000},
		timeout: 10 * time.Second, idle: time.Second},
	{Name: "race", title: "completion: last progress right before the reply (20 calls)", limit: "10s total",
		Tool: longOp, Args: op(0.1, 5), Repeat: 20, LingerMS: 300,
		TS:      tsOptions{TimeoutMS: 10000, Reset: true},
		timeout: 10 * time.Second},
	{Name: "user-cancel", title: "the user cancels at 1s", limit: "10s total",
		Tool: longOp, Args: op(3, 6), CancelMS: 1000, LingerMS: 2500,
		TS:      tsOptions{TimeoutMS: 10000, Reset: true},
		timeout: 10 * time.Second},
}

// result is how one client ran one scenario.
type result struct {
	Client   string   `json:"client"`
	Scenario string   `json:"scenario"`
	Calls    []called `json:"calls"`
	// Errors are errors the client raised (its onerror), such as for a
	// message that came after it had given up on a call.
	Errors []string `json:"errors"`
}

type called struct {
	Started  float64 `json:"started"` // ms since the epoch
	Ended    float64 `json:"ended"`
	FiredMS  float64 `json:"fired_ms"`
	Outcome  string  `json:"outcome"`
	Detail   string  `json:"detail"`
	Progress int     `json:"progress"` // progress events delivered
}

func main() {
	dir := flag.String("dir", "bench/mcp", "the directory of ts-client.mjs, wiretap.mjs and node_modules")
	out := flag.String("out", "bench/out/mcp", "where the wiretap logs go")
	only := flag.String("run", "", "run only the scenarios whose name contains this")
	flag.Parse()
	if err := run(*dir, *out, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench/mcp:", err)
		os.Exit(1)
	}
}

func run(dir, out, only string) error {
	node, err := exec.LookPath("node")
	if err != nil {
		return errors.New("node is not installed")
	}
	server := filepath.Join(dir, "node_modules", ".bin", "mcp-server-everything")
	if _, err := os.Stat(server); err != nil {
		return fmt.Errorf("%s is missing: run npm ci --prefix %s", server, dir)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var chosen []scenario
	for _, sc := range scenarios {
		if strings.Contains(sc.Name, only) {
			chosen = append(chosen, sc)
		}
	}

	fmt.Fprintln(os.Stderr, "running the TypeScript client…")
	ts, err := runTS(node, dir, out, chosen)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "running timebox…")
	var tb []result
	for _, sc := range chosen {
		r, err := runTimebox(node, dir, server, out, sc)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.Name, err)
		}
		tb = append(tb, r)
	}

	nodeVersion, _ := exec.Command(node, "--version").Output()
	fmt.Printf("Measured %s on %s/%s, %d CPUs; Go %s, node %s, @modelcontextprotocol/sdk %s, server-everything %s.\n\n",
		time.Now().Format("2006-01-02"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), strings.TrimPrefix(runtime.Version(), "go"),
		strings.TrimSpace(strings.TrimPrefix(string(nodeVersion), "v")), pkgVersion(dir, "@modelcontextprotocol/sdk"),
		pkgVersion(dir, "@modelcontextprotocol/server-everything"))
	fmt.Println("| scenario | limit | client | stopped at | reported as | cancellation sent at | progress delivered / sent (lost) | after the stop: late progress, late reply | errors raised |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for i, sc := range chosen {
		for _, r := range []result{ts[i], tb[i]} {
			row, err := analyse(sc, r, filepath.Join(out, r.Client+"-"+sc.Name+".jsonl"))
			if err != nil {
				return err
			}
			fmt.Println(row)
		}
	}
	return nil
}

func runTS(node, dir, out string, scs []scenario) ([]result, error) {
	in, err := json.Marshal(scs)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, filepath.Join(dir, "ts-client.mjs"), out)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ts-client.mjs: %w", err)
	}
	var rs []result
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("ts-client.mjs said %q: %w", sc.Text(), err)
		}
		rs = append(rs, r)
	}
	if len(rs) != len(scs) {
		return nil, fmt.Errorf("ts-client.mjs reported %d scenarios, want %d", len(rs), len(scs))
	}
	return rs, nil
}

// runTimebox runs a scenario as a turn would: mcptool's tool under
// tool.Run, with the scenario's limits as the tool's budget.
func runTimebox(node, dir, server, out string, sc scenario) (result, error) {
	log := filepath.Join(out, "timebox-"+sc.Name+".jsonl")
	b := budget.ToolBudget{
		Timeout:     budget.Duration{D: sc.timeout, Source: budget.SourceTool, Knob: "tools[everything].timeout"},
		IdleTimeout: budget.Duration{D: sc.idle, Source: budget.SourceTool, Knob: "tools[everything].idle_timeout"},
		Enforcement: budget.Hard,
		KillGrace:   budget.Duration{D: 2 * time.Second},
	}
	s, err := mcptool.Open(context.Background(), mcptool.Config{Name: "everything", Budget: b,
		Command: []string{node, filepath.Join(dir, "wiretap.mjs"), log, server, "stdio"}})
	if err != nil {
		return result{}, err
	}
	var tl *mcptool.Tool
	for _, t := range s.Tools() {
		if t.RemoteName() == sc.Tool {
			tl = t
		}
	}
	if tl == nil {
		s.Close()
		return result{}, fmt.Errorf("the server has no tool %s", sc.Tool)
	}
	input, _ := json.Marshal(sc.Args)
	r := result{Client: "timebox", Scenario: sc.Name}
	for i := 0; i < max(sc.Repeat, 1); i++ {
		ctx, cancel := context.WithCancelCause(context.Background())
		if sc.CancelMS > 0 {
			t := time.AfterFunc(time.Duration(sc.CancelMS)*time.Millisecond, func() {
				cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the user"})
			})
			defer t.Stop()
		}
		var progress atomic.Int64
		c := &tool.Call{ID: fmt.Sprintf("bench_%d", i), Tool: tl.Spec().Name, Input: input, MaxOutput: 1 << 20}
		x := tool.Run(ctx, tl, c, b, tool.Hooks{OnProgress: func(tool.Report) { progress.Add(1) }})
		cancel(nil)
		outcome := string(x.Outcome)
		if x.Phase != "" {
			outcome += ", phase " + string(x.Phase)
		}
		var info struct {
			Error tool.ErrorInfo `json:"error"`
		}
		detail := ""
		if json.Unmarshal([]byte(tool.ModelResult(tl.Spec().Name, b, x)), &info) == nil && info.Error.Type != "" {
			detail = info.Error.Type
		}
		r.Calls = append(r.Calls, called{Started: ms(x.Started), Ended: ms(x.Ended), FiredMS: float64(x.Elapsed().Microseconds()) / 1000,
			Outcome: outcome, Detail: detail, Progress: int(progress.Load())})
	}
	time.Sleep(time.Duration(sc.LingerMS) * time.Millisecond)
	s.Close()
	return r, nil
}

func ms(t time.Time) float64 { return float64(t.UnixMicro()) / 1000 }

// wire is one line of a wiretap log.
type wire struct {
	T         float64 `json:"t"`
	Dir       string  `json:"dir"`
	Method    string  `json:"method"`
	ID        any     `json:"id"`
	Token     any     `json:"token"`
	RequestID any     `json:"requestId"`
}

func key(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// analyse makes a client's table row for a scenario from its result and
// the wiretap's log.
func analyse(sc scenario, r result, log string) (string, error) {
	data, err := os.ReadFile(log)
	if err != nil {
		return "", err
	}
	var msgs []wire
	for line := range strings.Lines(string(data)) {
		var w wire
		if json.Unmarshal([]byte(line), &w) == nil {
			msgs = append(msgs, w)
		}
	}
	var calls []wire
	for _, m := range msgs {
		if m.Dir == "c2s" && m.Method == "tools/call" {
			calls = append(calls, m)
		}
	}
	if len(calls) != len(r.Calls) {
		return "", fmt.Errorf("%s: the wiretap saw %d calls, the client made %d", log, len(calls), len(r.Calls))
	}
	var fired, cancelAt []float64
	outcomes := map[string]int{}
	delivered, sent, lateProgress, lateReplies, noCancel := 0, 0, 0, 0, 0
	for i, req := range calls {
		c := r.Calls[i]
		fired = append(fired, c.FiredMS)
		o := c.Outcome
		if c.Detail != "" {
			o += ` "` + c.Detail + `"`
		}
		outcomes[o]++
		delivered += c.Progress
		stopped := c.Outcome != "ok" && !strings.HasPrefix(c.Outcome, "ok ")
		cancelled := false
		for _, m := range msgs {
			switch {
			case m.Dir == "c2s" && m.Method == "notifications/cancelled" && key(m.RequestID) == key(req.ID):
				if !cancelled {
					cancelAt = append(cancelAt, m.T-req.T)
				}
				cancelled = true
			case m.Dir == "s2c" && m.Method == "notifications/progress" && key(m.Token) == key(req.Token):
				if m.T <= c.Ended {
					sent++
				} else {
					lateProgress++
				}
			case m.Dir == "s2c" && m.Method == "" && key(m.ID) == key(req.ID) && m.T > c.Ended:
				lateReplies++
			}
		}
		if stopped && !cancelled {
			noCancel++
		}
	}
	cancelText := "—"
	switch {
	case len(cancelAt) > 0 && noCancel > 0:
		cancelText = fmt.Sprintf("%s; never for %d", spread(cancelAt), noCancel)
	case len(cancelAt) > 0:
		cancelText = spread(cancelAt)
	case noCancel > 0:
		cancelText = "never"
	}
	var reported []string
	for o, n := range outcomes {
		if strings.HasPrefix(o, "ok") {
			o = "ok"
		}
		if len(outcomes) > 1 || sc.Repeat > 1 {
			o = fmt.Sprintf("%d× %s", n, o)
		}
		reported = append(reported, o)
	}
	errText := "0"
	if len(r.Errors) > 0 {
		kinds := map[string]int{}
		for _, e := range r.Errors {
			kind, _, _ := strings.Cut(e, ":")
			kinds[kind]++
		}
		var parts []string
		for k, n := range kinds {
			parts = append(parts, fmt.Sprintf("%d× %q", n, k))
		}
		slices.Sort(parts)
		errText = fmt.Sprintf("%d: %s", len(r.Errors), strings.Join(parts, ", "))
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %d / %d (%d) | %d, %d | %s |",
		sc.title, sc.limit, clientName(r.Client), spread(fired), strings.Join(reported, "; "), cancelText,
		delivered, sent, max(sent-delivered, 0), lateProgress, lateReplies, errText), nil
}

func clientName(c string) string {
	if c == "ts" {
		return "TypeScript SDK"
	}
	return "timebox"
}

// spread renders one time, or the range of several, in seconds.
func spread(ms []float64) string {
	lo, hi := ms[0], ms[0]
	for _, v := range ms {
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi-lo < 1 {
		return fmt.Sprintf("%.3fs", lo/1000)
	}
	return fmt.Sprintf("%.3f–%.3fs", lo/1000, hi/1000)
}

func pkgVersion(dir, pkg string) string {
	data, err := os.ReadFile(filepath.Join(dir, "node_modules", pkg, "package.json"))
	if err != nil {
		return "?"
	}
	var p struct{ Version string }
	_ = json.Unmarshal(data, &p)
	return p.Version
}
