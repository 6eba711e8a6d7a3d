//go:build faults && linux

package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/procmem"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
)

// agentDir is a directory with an agent file, its script and its tools.
type agentDir struct {
	dir, file, db, pidfile string
}

// newAgent writes yaml as agent.yaml in a new directory, with the script
// model's lines as script.jsonl (when given) and each tool program
// (name → bash source) executable next to them.
func newAgent(t *testing.T, yaml string, script []string, tools map[string]string) agentDir {
	t.Helper()
	dir := t.TempDir()
	a := agentDir{dir: dir, file: filepath.Join(dir, "agent.yaml"), db: filepath.Join(dir, "timebox.db"), pidfile: filepath.Join(dir, "pids")}
	if err := os.WriteFile(a.file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if script != nil {
		if err := os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(strings.Join(script, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, src := range tools {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// toolOutput returns what the tool itself returned of a call's result:
// the result without timebox's notes after it (the output truncated, the
// time the call took: context.time_notes).
func toolOutput(result string) string {
	for _, note := range []string{"\n[output truncated", "\n[timebox: took "} {
		result, _, _ = strings.Cut(result, note)
	}
	return result
}

// scriptAgent is the YAML of an agent on the script model with the given
// timeouts, limits and tools (each a YAML flow mapping).
func scriptAgent(timeouts, limits string, tools ...string) string {
	y := "name: faults\nmodel: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"
	if timeouts != "" {
		y += "timeouts: {" + timeouts + "}\n"
	}
	if limits != "" {
		y += "limits: {" + limits + "}\n"
	}
	y += "tools:\n"
	for _, tl := range tools {
		y += "  - " + tl + "\n"
	}
	return y
}

// callTools is a script line asking for each named tool once.
func callTools(names ...string) string {
	calls := make([]string, len(names))
	for i, n := range names {
		calls[i] = fmt.Sprintf(`{"name": %q, "arguments": {}}`, n)
	}
	return `{"tool_calls": [` + strings.Join(calls, ", ") + `]}`
}

// pids reads the "role pid" lines the tool programs write to $PIDFILE.
func (a agentDir) pids() map[string][]int {
	b, _ := os.ReadFile(a.pidfile)
	out := map[string][]int{}
	for line := range strings.Lines(string(b)) {
		if role, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				out[role] = append(out[role], pid)
			}
		}
	}
	return out
}

// waitPIDs waits until the tools have written at least n pids.
func (a agentDir) waitPIDs(t *testing.T, n int, p *proc) map[string][]int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := a.pids()
		total := 0
		for _, v := range got {
			total += len(v)
		}
		if total >= n {
			return got
		}
		if time.Now().After(deadline) || p.exited() {
			t.Fatalf("the tools wrote %d pids of %d (timebox exited: %v)\n%s", total, n, p.exited(), p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// eventLog keeps the events a process wrote (--json lines) or a client
// read (SSE), and wakes whoever waits for one. The text of llm_delta
// events is dropped: an endless stream makes hundreds of thousands.
type eventLog struct {
	mu      sync.Mutex
	events  []event.Event
	deltas  int
	bad     []string // lines that were not events
	changed chan struct{}
	closed  bool
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

func (l *eventLog) add(line []byte) {
	var e event.Event
	err := json.Unmarshal(line, &e)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil || e.Type == "":
		l.bad = append(l.bad, fmt.Sprintf("%.200q (%v)", line, err))
	case e.Type == event.TypeLLMDelta:
		l.deltas++
		e.Data = nil
		l.events = append(l.events, e)
	default:
		l.events = append(l.events, e)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *eventLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.changed)
	}
}

// snapshot returns the events so far.
func (l *eventLog) snapshot() []event.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// waitFor waits up to d for an event of type typ and returns it, or false
// when the log ended or d passed first.
func (l *eventLog) waitFor(typ event.Type, d time.Duration) (event.Event, bool) {
	deadline := time.After(d)
	seen := 0
	for {
		l.mu.Lock()
		for ; seen < len(l.events); seen++ {
			if l.events[seen].Type == typ {
				e := l.events[seen]
				l.mu.Unlock()
				return e, true
			}
		}
		ch, closed := l.changed, l.closed
		l.mu.Unlock()
		if closed {
			return event.Event{}, false
		}
		select {
		case <-ch:
		case <-deadline:
			return event.Event{}, false
		}
	}
}

// readLines adds every line of r to l until EOF, then closes l.
func (l *eventLog) readLines(r io.Reader) {
	defer l.close()
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			l.add(line)
		}
		if err != nil {
			return
		}
	}
}

// proc is a timebox process under test.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	start  time.Time
	peak   func() int64
	log    *eventLog // its --json events, when it writes them
	stderr syncbuf.Buffer
	done   chan struct{}
	err    error         // cmd.Wait's, once done is closed
	took   time.Duration // from start to exit, once done is closed
}

// startTimebox starts the timebox binary with args, in dir, with env added
// to this process's environment and the test's marker (proctest.Env), so
// that the leak check counts timebox and everything it starts. Its stdout
// is read as JSON lines into p.log unless stdout is given.
func startTimebox(t *testing.T, dir string, env []string, stdout io.Writer, args ...string) *proc {
	t.Helper()
	return startTimeboxWith(t, dir, env, stdout, nil, args...)
}

// startTimeboxWith is startTimebox with setup applied to the command
// before it starts (a terminal for its standard files, say).
func startTimeboxWith(t *testing.T, dir string, env []string, stdout io.Writer, setup func(*exec.Cmd), args ...string) *proc {
	t.Helper()
	p := &proc{t: t, log: newEventLog(), done: make(chan struct{})}
	p.cmd = exec.Command(binary(t), args...)
	p.cmd.Dir = dir
	p.cmd.Env = proctest.Env(append(os.Environ(), env...))
	p.cmd.Stderr = &p.stderr
	var out io.ReadCloser
	if stdout != nil {
		p.cmd.Stdout = stdout
	} else {
		r, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		out = r
	}
	if setup != nil {
		setup(p.cmd)
	}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.peak = procmem.Watch(p.cmd.Process.Pid)
	var reading sync.WaitGroup
	if out != nil {
		reading.Go(func() { p.log.readLines(out) })
	} else {
		p.log.close()
	}
	go func() {
		reading.Wait() // Wait closes the pipe: read it to its end first
		p.err = p.cmd.Wait()
		p.took = time.Since(p.start)
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// theCall returns the tool_finished of the one call p's --json log holds,
// failing t when there is none.
func (p *proc) theCall(t *testing.T) *event.ToolFinished {
	t.Helper()
	var rec *event.ToolFinished
	for _, r := range toolRecords(p.log.snapshot()) {
		rec = r
	}
	if rec == nil {
		t.Fatalf("no tool_finished\n%s", p.stderr.String())
	}
	return rec
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the process to exit, killing it then, and
// returns its exit code (-1 for a death by a signal, with the signal
// named in the failure).
func (p *proc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("timebox had not exited after %s; killed\nstderr: %s", d, p.stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.t.Errorf("timebox died of %v\nstderr: %s", ws.Signal(), p.stderr.String())
			return -1
		}
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Errorf("timebox: %v", p.err)
		return -1
	}
	return 0
}

// servingRE finds serve's address and store in what it prints at start.
var servingRE = regexp.MustCompile(`on (http://\S+) \(store: ([^)]*)\)`)

// startServe starts `timebox serve` on a free loopback port with the
// given store and more flags, and returns it and its base URL.
func startServe(t *testing.T, a agentDir, env []string, flags ...string) (*proc, string) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "-f", a.file, "--addr", "127.0.0.1:0", "--db", a.db}, flags...)
	p := startTimebox(t, a.dir, env, pw, args...)
	pw.Close()
	url := make(chan string, 1)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				url <- m[1]
				io.Copy(io.Discard, pr)
				return
			}
		}
		close(url)
	}()
	select {
	case u, ok := <-url:
		if !ok {
			t.Fatalf("serve printed no address\n%s", p.stderr.String())
		}
		return p, u
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start in 30s\n%s", p.stderr.String())
	}
	return nil, ""
}

// follower is an SSE client of a turn posted to serve.
type follower struct {
	resp   *http.Response
	log    *eventLog
	turnID string
	cancel context.CancelFunc
	done   chan struct{}
}

// postTurn posts a turn to serve as an SSE client that follows it
// (spec §12) and reads its events into f.log until the stream ends or
// f.leave is called.
func postTurn(t *testing.T, url, body string) *follower {
	t.Helper()
	return follow(t, "POST", url+"/v1/turns", body)
}

// replayTurn follows a turn's events from the first (GET
// /v1/turns/{id}/events), as a client that comes back does.
func replayTurn(t *testing.T, url, id string) *follower {
	t.Helper()
	return follow(t, "GET", url+"/v1/turns/"+id+"/events?after=0", "")
}

func follow(t *testing.T, method, url, body string) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("%s %s: %s %s", method, url, resp.Status, b)
	}
	f := &follower{resp: resp, log: newEventLog(), turnID: resp.Header.Get("Timebox-Turn-Id"), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		defer f.log.close()
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				f.log.add(data)
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(f.leave)
	return f
}

// leave closes the client's connection, as a browser tab that is closed.
func (f *follower) leave() {
	f.cancel()
	f.resp.Body.Close()
	<-f.done
}

// turnRecord fetches a turn's record from serve.
func turnRecord(url, id string) (*event.Turn, error) {
	resp, err := http.Get(url + "/v1/turns/" + id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var rec event.Turn
	return &rec, json.NewDecoder(resp.Body).Decode(&rec)
}

// stored opens a store file once its timebox is gone, and returns its only
// turn (or the one with id, when given) and that turn's stored events.
func stored(t *testing.T, db, id string) (*event.Turn, []event.Event) {
	t.Helper()
	st, err := sqlite.Open(db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if id == "" {
		list, err := st.Turns(ctx, store.Filter{})
		if err != nil || len(list) != 1 {
			t.Fatalf("stored turns %+v, %v; want one", list, err)
		}
		id = list[0].TurnID
	}
	rec, err := st.Turn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := st.Events(ctx, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rec, evs
}

// finished returns the turn_finished of events, or nil.
func finished(events []event.Event) *event.TurnFinished {
	for _, e := range slices.Backward(events) {
		if f, ok := e.Data.(*event.TurnFinished); ok {
			return f
		}
	}
	return nil
}

// toolRecords returns the records the tool_finished events carry, by call.
func toolRecords(events []event.Event) map[string]*event.ToolFinished {
	out := map[string]*event.ToolFinished{}
	for _, e := range events {
		if f, ok := e.Data.(*event.ToolFinished); ok {
			out[f.CallID] = f
		}
	}
	return out
}

// recordsLost counts what a turn failed to keep, comparing what timebox
// emitted (seen: its --json lines or an SSE stream, complete to its
// turn_finished) with the store: a tool call that started without a
// tool_finished, or without a stored record, or whose stored record
// differs from its event; an emitted event missing from the store; a
// stored turn whose end differs from turn_finished (or no turn_finished).
// It returns the count and a description of each loss.
func recordsLost(seen []event.Event, rec *event.Turn, storedEvents []event.Event) (int, []string) {
	n := 0
	var lost []string
	lose := func(format string, args ...any) {
		n++
		lost = append(lost, fmt.Sprintf(format, args...))
	}
	fin := finished(seen)
	if fin == nil {
		lose("no turn_finished was emitted")
	} else if rec.Status != fin.Status || rec.StopReason != fin.StopReason || rec.Message != fin.Message || rec.Answer != fin.Answer {
		lose("the stored turn ended %s/%s (%d bytes of answer), turn_finished %s/%s (%d bytes)",
			rec.Status, rec.StopReason, len(rec.Answer), fin.Status, fin.StopReason, len(fin.Answer))
	}
	records := toolRecords(seen)
	keptCalls := map[string]event.ToolCall{}
	for _, c := range rec.ToolCalls {
		keptCalls[c.CallID] = c
	}
	for _, e := range seen {
		s, ok := e.Data.(*event.ToolStarted)
		if !ok {
			continue
		}
		f, ok := records[s.CallID]
		if !ok {
			lose("call %s started without a tool_finished", s.CallID)
			continue
		}
		k, ok := keptCalls[s.CallID]
		if !ok {
			lose("call %s has no stored record", s.CallID)
			continue
		}
		if k.Outcome != f.Outcome || k.Result != f.Result || k.ProgressCount != f.ProgressCount || k.StderrTail != f.StderrTail ||
			k.Truncated != f.Truncated || k.DurationMS != f.DurationMS {
			lose("call %s: its stored record differs from its tool_finished (outcome %s/%s, result %d/%d bytes, progress %d/%d, stderr tail %d/%d bytes)",
				s.CallID, k.Outcome, f.Outcome, len(k.Result), len(f.Result), k.ProgressCount, f.ProgressCount, len(k.StderrTail), len(f.StderrTail))
		}
	}
	have := map[int64]event.Type{}
	for _, e := range storedEvents {
		have[e.Seq] = e.Type
	}
	missing := 0
	for _, e := range seen {
		if typ, ok := have[e.Seq]; !ok || typ != e.Type {
			missing++
			n++
			if missing <= 3 {
				lost = append(lost, fmt.Sprintf("event %d (%s) is not stored", e.Seq, e.Type))
			}
		}
	}
	if missing > 3 {
		lost = append(lost, fmt.Sprintf("%d events not stored in all", missing))
	}
	return n, lost
}

// records asserts that nothing was lost (recordsLost).
func (s *scenario) records(seen []event.Event, rec *event.Turn, storedEvents []event.Event) {
	s.t.Helper()
	n, lost := recordsLost(seen, rec, storedEvents)
	if n > 0 {
		s.t.Logf("lost: %s", strings.Join(lost, "; "))
	}
	s.addKind(kindLost, "records lost", "= 0", fmt.Sprint(n), n == 0)
}

// nothingLeft asserts that no process the scenario's timebox processes
// started is alive: a scan for the test's marker, which every tool process
// inherits (waiting up to proctest.Wait for processes on their way out),
// and the call cgroups each timebox process made, which hold even a
// process that cleared its environment.
func (s *scenario) nothingLeft(timeboxes ...int) {
	s.t.Helper()
	left := map[int]string{}
	for _, l := range proctest.Leaks(proctest.Wait) {
		var pid int
		fmt.Sscanf(l, "pid %d", &pid)
		left[pid] = l
	}
	for _, tb := range timeboxes {
		in, err := proctree.CgroupMembers(tb)
		if err != nil {
			s.t.Errorf("the cgroups of timebox %d: %v", tb, err)
		}
		for _, pid := range in {
			left[pid] += fmt.Sprintf(" (pid %d in a call cgroup of timebox %d)", pid, tb)
		}
	}
	if len(left) > 0 {
		var list []string
		for pid, l := range left {
			list = append(list, l)
			if pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL) // leave nothing to the next scenario
			}
		}
		s.t.Logf("left running:\n\t%s", strings.Join(list, "\n\t"))
	}
	s.addKind(kindLeft, "processes left", "= 0", fmt.Sprint(len(left)), len(left) == 0)
}

// allDead asserts that every pid the tools wrote is gone.
func (s *scenario) allDead(pids map[string][]int) {
	s.t.Helper()
	seen := map[int]bool{}
	var living []string
	for role, ps := range pids {
		for _, pid := range ps {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			if alive(pid) {
				living = append(living, fmt.Sprintf("%s %d", role, pid))
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if len(living) > 0 {
		s.t.Logf("alive: %s", strings.Join(living, ", "))
	}
	s.addKind(kindLeft, "of the tool's own pids, alive after it", "0", fmt.Sprintf("%d of %d", len(living), len(seen)), len(living) == 0)
}
