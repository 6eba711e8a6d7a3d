//go:build faults && linux

package faults

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/procmem"
)

// idleFollowers: 5,000 followers of one turn through `timebox serve`,
// the turn waiting in a tool. A follower that has nothing to read holds no
// goroutine in serve, only its connection and its place in the turn
// (docs/decisions/parked-followers.md): issue 29 asks for 10 KB a
// follower at most. With a goroutine a follower, serve's heap and stacks
// grew 33 KiB a follower (BenchmarkIdleFollowers, in process); parked,
// 2 KiB, and its resident set 5.0 KiB here (2026-11-26).
func idleFollowers(t *testing.T) {
	const n = 5000
	sc := begin(t, fmt.Sprintf("%d followers of a turn waiting in a tool", n), "timebox serve, raw connections")
	a := hangAgent(t)
	tb, url := startServe(t, a, []string{"PIDFILE=" + a.pidfile})
	f := postTurn(t, url, `{"input": "go"}`)
	pids := waitTool(t, a, tb)
	addr := strings.TrimPrefix(url, "http://")
	before := procmem.Resident(tb.pid())
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := followUntil(addr, f.turnID, "event: tool_started")
				if err != nil {
					errs <- err
					continue
				}
				conns[i] = c
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed == 0 {
			t.Errorf("a follower: %v", err)
		}
		failed++
	}
	sc.count("followers that failed to start", failed, 0)
	// Serve's garbage from the followers' replays is collected and
	// returned within seconds: what stays is what the followers hold.
	during := settled(tb.pid(), 10*time.Second)
	per := float64(during-before) / n / 1024
	sc.add("serve's resident memory an idle follower", "≤ 10 KiB", fmt.Sprintf("%.1f KiB", per), before > 0 && per <= 10)
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	f.leave()
	tb.cmd.Process.Signal(syscall.SIGTERM)
	if code := tb.wait(30 * time.Second); code != 0 {
		t.Errorf("serve exited %d after SIGTERM\n%s", code, tb.stderr.String())
	}
	sc.allDead(pids)
	sc.nothingLeft(tb.pid())
}

// followUntil opens a follower's stream of turn id on a raw connection
// and reads it up to the line want.
func followUntil(addr, id, want string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /v1/turns/%s/events HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", id, addr)
	r := bufio.NewReaderSize(c, 256)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			c.Close()
			return nil, err
		}
		if strings.TrimSpace(line) == want {
			return c, nil
		}
	}
}

// settled returns the resident set of process pid once it has stopped
// shrinking (two readings 500 ms apart within 1%), or after within.
func settled(pid int, within time.Duration) int64 {
	last := procmem.Resident(pid)
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		now := procmem.Resident(pid)
		if now >= last-last/100 {
			return now
		}
		last = now
	}
	return last
}
