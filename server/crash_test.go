package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store/sqlite"
)

// helperEnv makes the test binary a server (on the store the variable
// names) that runs until it is killed.
const helperEnv = "TIMEBOX_SERVER_CRASH_HELPER"

// helperMain runs the helper server when asked and reports whether it did.
func helperMain() bool {
	path := os.Getenv(helperEnv)
	if path == "" {
		return false
	}
	t := &testing.T{}
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	g := newGate("wait")
	g.every = 10 * time.Millisecond
	srv, err := server.New(server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool()), Store: st})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	srv.Serve(context.Background(), ln)
	return true
}

// TestKill9MidTurn kills the server process mid-turn: everything it
// streamed is in the store, and the next process to open the store marks
// the turn interrupted.
func TestKill9MidTurn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		t.Fatalf("helper said %q, %v", line, err)
	}
	e := &env{t: t, url: "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening ")), client: newClient(t)}
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "crawl", "detach": true}), 202)
	resp := e.do("GET", acc.Events, nil)
	sse := newSSE(resp.Body)
	seen := sse.until(t, "tool_started")
	for range 5 {
		seen = append(seen, sse.until(t, "tool_progress")...)
	}
	cmd.Process.Kill() // SIGKILL
	cmd.Wait()
	resp.Body.Close()

	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if r := st.Recovered(); len(r) != 1 || r[0] != acc.TurnID {
		t.Fatalf("Recovered() = %v", r)
	}
	rec, err := st.Turn(context.Background(), acc.TurnID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "Tool wait was running") {
		t.Fatalf("record %s: %s", rec.Status, rec.Message)
	}
	evs, err := st.Events(context.Background(), acc.TurnID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Followers are sent each event as it is emitted, before the store
	// commits it: the kill may lose the last ones streamed. What is stored
	// of them is what was streamed; the recovery's events come after every
	// seq a follower was shown, so one that resumes from its last event
	// gets the turn's end.
	streamed := map[int64]string{}
	var lastSeen int64
	for _, ev := range seen {
		streamed[ev.id] = ev.data
		lastSeen = max(lastSeen, ev.id)
	}
	for _, e := range evs[:len(evs)-2] {
		b, _ := e.MarshalJSON()
		if d, ok := streamed[e.Seq]; ok && d != string(b) {
			t.Fatalf("event %d: streamed %s, stored %s", e.Seq, d, b)
		}
	}
	if n := len(evs) - 2; n < len(seen)-5 {
		t.Errorf("%d events stored of %d streamed: more than the last few were lost", n, len(seen))
	}
	for _, e := range evs[len(evs)-2:] {
		if e.Seq <= lastSeen {
			t.Fatalf("the recovery's %s has seq %d, not after the %d a follower was shown", e.Type, e.Seq, lastSeen)
		}
	}
	if evs[len(evs)-1].Type != event.TypeTurnFinished {
		t.Fatalf("the log ends with %s", evs[len(evs)-1].Type)
	}
}
