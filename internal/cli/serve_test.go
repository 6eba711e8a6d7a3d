package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/store/sqlite"
)

// agentFile writes an agent on the script model answering with the given
// lines, and returns its path.
func agentFile(t *testing.T, lines ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml := "name: clitest\nmodel:\n  primary: script:m\nproviders:\n  script:\n    file: script.jsonl\n"
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

type result struct {
	code     int
	out, err string
}

func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(t.Context(), args, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb, Env: env})
	return result{code, out.String(), errb.String()}
}

var servingRE = regexp.MustCompile(`on (http://\S+) \(store: ([^)]*)\)`)

// serveInProcess runs `timebox serve` with args in this process and
// returns its URL, the store it printed, and the function that stops it
// (as SIGTERM would) and returns its exit code.
func serveInProcess(t *testing.T, env []string, args ...string) (url, where string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var out, errb syncbuf.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...),
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb, Env: env})
	}()
	stop = func() int {
		cancel()
		code := <-exited
		if code != cli.ExitOK {
			t.Errorf("serve exited %d: %s", code, errb.String())
		}
		return code
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			return m[1], m[2], stop
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("serve printed no address; out %q err %q", out.String(), errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// postTurn posts a turn and returns its record.
func postTurn(t *testing.T, url, body string) event.Turn {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(url+"/v1/turns", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rec event.Turn
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestServeThenRuns(t *testing.T) {
	file := agentFile(t, `{"text": "hello from the script"}`)
	db := filepath.Join(t.TempDir(), "timebox.db")
	url, where, stop := serveInProcess(t, nil, "-f", file, "--db", db)
	if where != db {
		t.Fatalf("serving with store %q", where)
	}
	rec := postTurn(t, url, `{"input": "hi", "session_id": "cli"}`)
	if rec.Status != budget.StatusCompleted || rec.Answer != "hello from the script" || rec.Agent != "clitest" {
		t.Fatalf("record %+v", rec)
	}
	if stop() != cli.ExitOK {
		t.FailNow()
	}

	r := run(t, nil, "runs", "list", "--db", db)
	if r.code != 0 || !strings.Contains(r.out, rec.TurnID) || !strings.Contains(r.out, "completed") || !strings.Contains(r.out, "answered") {
		t.Fatalf("runs list: %d %q %q", r.code, r.out, r.err)
	}
	r = run(t, []string{"TIMEBOX_DB=" + db}, "runs", "show", rec.TurnID)
	if r.code != 0 || !strings.Contains(r.out, "status   completed (answered)") || !strings.Contains(r.out, "model calls") ||
		!strings.Contains(r.out, "hello from the script") {
		t.Fatalf("runs show: %d %q %q", r.code, r.out, r.err)
	}
	r = run(t, nil, "runs", "export", rec.TurnID, "--db", db)
	if r.code != 0 {
		t.Fatalf("runs export: %d %q", r.code, r.err)
	}
	sc := bufio.NewScanner(strings.NewReader(r.out))
	n := int64(0)
	var last event.Event
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatalf("line %d: %v", n+1, err)
		}
		n++
		if last.Seq != n || last.TurnID != rec.TurnID {
			t.Fatalf("line %d is event %d of %s", n, last.Seq, last.TurnID)
		}
	}
	if n < 4 || last.Type != event.TypeTurnFinished {
		t.Fatalf("%d events, last %s", n, last.Type)
	}
	r = run(t, nil, "runs", "show", "--json", "--db", db, rec.TurnID)
	var shown event.Turn
	if err := json.Unmarshal([]byte(r.out), &shown); err != nil || int64(len(shown.Events)) != n {
		t.Fatalf("runs show --json: %v, %d events", err, len(shown.Events))
	}
	r = run(t, nil, "runs", "show", "t_nope", "--db", db)
	if r.code != cli.ExitFailed || !strings.Contains(r.err, "no turn t_nope in the store at "+db) {
		t.Fatalf("runs show t_nope: %d %q", r.code, r.err)
	}
}

// TestOneDefaultStore: without --db or TIMEBOX_DB, `timebox serve` keeps
// its turns where `timebox run` does, so `timebox runs show` finds a turn
// serve ran; a turn not found names the store that was read.
func TestOneDefaultStore(t *testing.T) {
	file := agentFile(t, `{"text": "served"}`)
	home := t.TempDir()
	env := []string{"HOME=" + home}
	want := filepath.Join(home, ".local", "state", "timebox", "timebox.db")
	url, where, stop := serveInProcess(t, env, "-f", file)
	if where != want {
		t.Errorf("serve stores in %q, want %q", where, want)
	}
	rec := postTurn(t, url, `{"input": "hi"}`)
	stop()
	if r := run(t, env, "runs", "show", rec.TurnID); r.code != 0 || !strings.Contains(r.out, "served") {
		t.Fatalf("runs show of serve's turn: %d %q %q", r.code, r.out, r.err)
	}
	if r := run(t, env, "run", "-f", file, "--json", "again"); r.code != 0 {
		t.Fatalf("run: %d %q", r.code, r.err)
	}
	r := run(t, env, "runs", "list", "--json")
	if r.code != 0 || !strings.Contains(r.out, rec.TurnID) || !strings.Contains(r.out, "again") {
		t.Fatalf("runs list does not show both: %d %q", r.code, r.out)
	}
	r = run(t, env, "runs", "show", "t_nope")
	if r.code != cli.ExitFailed || !strings.Contains(r.err, "in the store at "+want) {
		t.Fatalf("runs show t_nope: %d %q", r.code, r.err)
	}
	r = run(t, env, "runs", "list", "--status", "failed")
	if !strings.Contains(r.err, "no turns match in the store at "+want) {
		t.Fatalf("runs list with no match: %d %q", r.code, r.err)
	}
}

func TestServeRefusesAPublicAddressWithoutAToken(t *testing.T) {
	file := agentFile(t, `{"text": "x"}`)
	for _, args := range [][]string{
		{"serve", "-f", file, "--addr", "0.0.0.0:0"},
		{"serve", "-f", file, "--addr", ":8080"},
	} {
		r := run(t, nil, args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.err, "refusing to serve on") || !strings.Contains(r.err, "TIMEBOX_TOKEN") {
			t.Errorf("%v: %d %q", args, r.code, r.err)
		}
	}
	r := run(t, []string{"TIMEBOX_ADDR=0.0.0.0:9"}, "serve", "-f", file)
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "0.0.0.0:9") {
		t.Errorf("TIMEBOX_ADDR: %d %q", r.code, r.err)
	}
}

// TestBadSettingsNameWhereTheyCameFrom: a bad value of a setting that a
// flag or a TIMEBOX_* variable gives is refused naming the one it came
// from, and an address's port is checked before serving, token or not.
func TestBadSettingsNameWhereTheyCameFrom(t *testing.T) {
	file := agentFile(t, `{"text": "x"}`)
	db := "TIMEBOX_DB=" + filepath.Join(t.TempDir(), "timebox.db") // were the address taken
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"TIMEBOX_ENGINE=foo"}, []string{"validate", "-f", file}, `TIMEBOX_ENGINE "foo": use embedded or temporal`},
		{nil, []string{"validate", "--engine", "foo", "-f", file}, `--engine "foo": use embedded or temporal`},
		{[]string{"TIMEBOX_TEMPORAL_ADDRESS=zz"}, []string{"validate", "-f", file}, `TIMEBOX_TEMPORAL_ADDRESS "zz": give HOST:PORT`},
		{[]string{"TIMEBOX_ADDR=nonsense"}, []string{"serve", "-f", file}, `TIMEBOX_ADDR: address "nonsense": missing port in address`},
		{nil, []string{"serve", "-f", file, "--addr", "127.0.0.1:99999"}, `--addr: address "127.0.0.1:99999": invalid port`},
		{[]string{"TIMEBOX_TOKEN=a-long-enough-token-0123456789"}, []string{"serve", "-f", file, "--addr", ":-1"}, `--addr: address ":-1": invalid port`},
	} {
		r := run(t, append(c.env, db), c.args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.err, c.want) {
			t.Errorf("%v %v: %d %q, want %q", c.env, c.args, r.code, r.err, c.want)
		}
	}
}

// TestRunsShowWritesControlCharactersOut: a turn's input (from any client
// of serve) and its stored texts reach the operator's terminal through
// runs list, show and --timeline with their control characters written
// out.
func TestRunsShowWritesControlCharactersOut(t *testing.T) {
	file := agentFile(t, `{"text": "ok \u001b]0;title\u0007"}`)
	db := filepath.Join(t.TempDir(), "timebox.db")
	r := run(t, nil, "run", "-f", file, "--db", db, "--json", "hi \x1b]52;c;ZXZpbA==\x07 there")
	if r.code != 0 {
		t.Fatalf("run: %d %q", r.code, r.err)
	}
	id := regexp.MustCompile(`"turn_id":"([^"]+)"`).FindStringSubmatch(r.out)[1]
	for _, args := range [][]string{{"runs", "list"}, {"runs", "show", id}, {"runs", "show", "--timeline", id}} {
		r := run(t, nil, append(args, "--db", db)...)
		if r.code != 0 || strings.ContainsAny(r.out, "\x07\x1b") {
			t.Errorf("%v: %d %q", args, r.code, r.out)
		}
	}
}

// fullWriter fails every write as a full disk does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// TestRunSaysItsOutputWasLost: output that could not be written (a full
// disk) fails the command, saying so, where it used to exit 0 with the
// answer lost; so does a --record file that could not be written.
func TestRunSaysItsOutputWasLost(t *testing.T) {
	file := agentFile(t, `{"text": "the answer"}`)
	for _, args := range [][]string{{"--json"}, {}} {
		var errb bytes.Buffer
		code := cli.Run(t.Context(), append(append([]string{"run", "--no-store", "-f", file}, args...), "hi"),
			cli.IO{In: strings.NewReader(""), Out: fullWriter{}, Err: &errb})
		if code != cli.ExitFailed || !strings.Contains(errb.String(), "writing to standard output: no space left on device") {
			t.Errorf("%v: exit %d, %q", args, code, errb.String())
		}
	}
	if _, err := os.Stat("/dev/full"); err == nil {
		r := run(t, nil, "run", "--no-store", "-f", file, "--record", "/dev/full", "hi")
		if r.code != cli.ExitFailed || !strings.Contains(r.err, "--record: write /dev/full: no space left on device") {
			t.Errorf("--record /dev/full: exit %d, %q", r.code, r.err)
		}
	}
}

// endless is an input that never ends, as `yes` is.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'y'
	}
	return len(p), nil
}

// TestRunChecksItsInputAsServeDoes: timebox run's prompt and session id
// are held to the rules of POST /v1/turns: a prompt read from an endless
// standard input is refused once past the limit, not read into memory
// until the machine runs out.
func TestRunChecksItsInputAsServeDoes(t *testing.T) {
	file := agentFile(t, `{"text": "x"}`)
	for _, c := range []struct {
		in   io.Reader
		args []string
		want string
	}{
		{endless{}, []string{"-"}, "the prompt is over 256KiB"},
		{strings.NewReader(strings.Repeat("a", agent.MaxInputBytes+1)), []string{"-"}, "the prompt is over 256KiB"},
		{strings.NewReader("hi \xff"), []string{"-"}, "the prompt is not valid UTF-8"},
		{nil, []string{"--session", "../../x", "hi"}, `--session "../../x": a session id is 1 to 128`},
		{nil, []string{"--session", strings.Repeat("s", 129), "hi"}, "a session id is 1 to 128"},
	} {
		if c.in == nil {
			c.in = strings.NewReader("")
		}
		var errb bytes.Buffer
		code := cli.Run(t.Context(), append([]string{"run", "--no-store", "-f", file}, c.args...),
			cli.IO{In: c.in, Out: io.Discard, Err: &errb})
		if code != cli.ExitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want %q", c.args, code, errb.String(), c.want)
		}
	}
	code := cli.Run(t.Context(), []string{"run", "--no-store", "-f", file, "-"},
		cli.IO{In: strings.NewReader(strings.Repeat("a", agent.MaxInputBytes)), Out: io.Discard, Err: io.Discard})
	if code != cli.ExitOK {
		t.Errorf("a prompt of the limit exactly: exit %d", code)
	}
	// A budget flag that took the prompt as its value is named.
	r := run(t, nil, "run", "--no-store", "-f", file, "--max-steps", "hi")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, `no prompt: --max-steps took "hi" as its value`) {
		t.Errorf("--max-steps hi: exit %d, %q", r.code, r.err)
	}
	if r := run(t, nil, "run", "--no-store", "-f", file); strings.Contains(r.err, "took") {
		t.Errorf("-f FILE and no prompt: %q", r.err)
	}
}

func TestRunStoresItsTurn(t *testing.T) {
	file := agentFile(t, `{"text": "one"}`, `{"text": "two"}`)
	dir := t.TempDir()
	db := filepath.Join(dir, "timebox.db")
	for _, prompt := range []string{"first", "second"} {
		if r := run(t, nil, "run", "-f", file, "--db", db, "--session", "s1", "--json", prompt); r.code != 0 {
			t.Fatalf("run: %d %q", r.code, r.err)
		}
	}
	if r := run(t, nil, "run", "-f", file, "--db", db, "--no-store", "not stored"); r.code != 0 {
		t.Fatalf("run --no-store: %d %q", r.code, r.err)
	}
	if r := run(t, []string{"TIMEBOX_DB=" + db}, "run", "-f", file, "--db", "", "not stored either"); r.code != 0 {
		t.Fatalf(`run --db "": %d %q`, r.code, r.err)
	}
	r := run(t, nil, "runs", "list", "--db", db, "--json")
	if n := strings.Count(r.out, "\n"); n != 2 || strings.Contains(r.out, "not stored") {
		t.Fatalf("runs list: %q", r.out)
	}
	st, err := sqlite.Open(db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h, err := st.History(context.Background(), "s1")
	if err != nil || len(h) != 4 || h[0].Content != "first" || h[3].Content != "one" {
		t.Fatalf("session history %+v, %v", h, err)
	}
	// The script model keeps its place per conversation only in its own
	// process, so the second run's answer says nothing; the history given
	// to the model is checked in package server.
}

func TestRunsUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.db")
	for _, c := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"runs"}, cli.ExitUsage, "usage"},
		{[]string{"runs", "frobnicate"}, cli.ExitUsage, "unknown subcommand"},
		{[]string{"runs", "show"}, cli.ExitUsage, "give the turn's ID"},
		{[]string{"runs", "list", "extra"}, cli.ExitUsage, "usage"},
		{[]string{"runs", "list", "--db", missing}, cli.ExitFailed, "no store at"},
	} {
		r := run(t, nil, c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.err) {
			t.Errorf("%v: %d %q", c.args, r.code, r.err)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("runs list created the store it did not find")
	}
}

// Without --db or TIMEBOX_DB, `timebox run` keeps its turns in the user's
// state directory, not the working directory, and `timebox runs` finds
// them there.
func TestRunStoresInTheStateDirectory(t *testing.T) {
	file := agentFile(t, `{"text": "one"}`)
	cases := []struct {
		name string
		env  func(home string) []string
		want func(home string) string
	}{
		{"XDG_STATE_HOME", func(home string) []string {
			return []string{"HOME=" + home, "XDG_STATE_HOME=" + filepath.Join(home, "state")}
		},
			func(home string) string { return filepath.Join(home, "state", "timebox", "timebox.db") }},
		{"HOME alone", func(home string) []string { return []string{"HOME=" + home} },
			func(home string) string { return filepath.Join(home, ".local", "state", "timebox", "timebox.db") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			env := tc.env(home)
			if r := run(t, env, "run", "-f", file, "--json", "stored by default"); r.code != 0 {
				t.Fatalf("run: %d %q", r.code, r.err)
			}
			if _, err := os.Stat(tc.want(home)); err != nil {
				t.Fatalf("no store where it belongs: %v", err)
			}
			r := run(t, env, "runs", "list", "--json")
			if r.code != 0 || !strings.Contains(r.out, "stored by default") {
				t.Fatalf("runs list: %d %q %q", r.code, r.out, r.err)
			}
		})
	}
	if _, err := os.Stat("timebox.db"); err == nil {
		t.Error("a store was made in the working directory")
	}
}

// TestAnAddressInUseIsSaidWithTheFix: serve and mcp serve on a port
// another process holds say so, name where the address came from and the
// flag that changes it, instead of the system's "bind: address already in
// use".
func TestAnAddressInUseIsSaidWithTheFix(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	file := agentFile(t, `{"text": "x"}`)
	db := "TIMEBOX_DB=" + filepath.Join(t.TempDir(), "timebox.db")
	for _, c := range []struct {
		env  []string
		args []string
		from string
	}{
		{[]string{db}, []string{"serve", "-f", file, "--addr", addr}, "(from --addr)"},
		{[]string{db, "TIMEBOX_ADDR=" + addr}, []string{"serve", "-f", file}, "(from TIMEBOX_ADDR)"},
		{[]string{db}, []string{"mcp", "serve", "-f", file, "--addr", addr}, "(from --addr)"},
	} {
		r := run(t, c.env, c.args...)
		want := addr + " " + c.from + " is already in use by another process; stop that process, or listen on another port, such as --addr 127.0.0.1:"
		if r.code != cli.ExitFailed || !strings.Contains(r.err, want) {
			t.Errorf("%v %v: %d %q, want %q", c.env, c.args, r.code, r.err, want)
		}
	}
}
