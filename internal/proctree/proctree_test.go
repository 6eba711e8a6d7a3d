//go:build linux

package proctree

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/timebox-run/timebox/internal/testenv"
)

// The leak check lives in internal/proctest, which imports this package;
// these tests use the same function it is built on (Running).

const helperArg = "proctree-helper"

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		// syscall.Exit skips the race detector's one-second sleep at exit.
		syscall.Exit(helper(os.Args[2]))
	}
	// Close removes the idle cgroups now rather than leave them for the
	// next process to clean up.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { Close(); os.Exit(code) }))
}

func helper(mode string) int {
	switch mode {
	case "hang":
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "reap":
		// Another timebox process starting: it reaps, then says so.
		fmt.Println("ready")
		ReapOrphans()
		fmt.Println("reaped")
	case "env":
		fmt.Println(os.Getenv(EnvMarker))
		time.Sleep(time.Hour)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "count-term":
		// Says "TERM" for each SIGTERM, and exits 100ms after the first.
		c := make(chan os.Signal, 4)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		<-c
		fmt.Println("TERM")
		timeout := time.After(100 * time.Millisecond)
		for {
			select {
			case <-c:
				fmt.Println("TERM")
			case <-timeout:
				return 0
			}
		}
	case "term-spawns":
		// On SIGTERM, starts a child and waits for it: the child did not
		// exist when the tree was signalled.
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		<-c
		child := exec.Command(self(), helperArg, "hang")
		if err := child.Start(); err != nil {
			return 1
		}
		child.Wait()
		return 0
	case "spawn-on-usr1":
		// On SIGUSR1, starts a count-term child in its own process group
		// (their stdout is shared); says "ROOT-TERM" for each SIGTERM.
		usr1, term := make(chan os.Signal, 1), make(chan os.Signal, 4)
		signal.Notify(usr1, syscall.SIGUSR1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("ready")
		for {
			select {
			case <-usr1:
				child := exec.Command(self(), helperArg, "count-term")
				child.Stdout = os.Stdout
				if err := child.Start(); err != nil {
					fmt.Println("error", err)
					return 1
				}
			case <-term:
				fmt.Println("ROOT-TERM")
			}
		}
	case "own-tree":
		// A timebox-like owner: starts "setsid-child" as a tree with the
		// strategy named in TIMEBOX_PROCTREE, prints the root's pid and
		// then the grandchild's, and waits to be killed.
		tree, sc, ok := helperTree("setsid-child")
		if !ok {
			return 1
		}
		fmt.Println(tree.PID())
		if !sc.Scan() {
			return 1
		}
		fmt.Println(sc.Text())
		time.Sleep(time.Hour)
	case "tty-owner":
		// A timebox on a terminal (its controlling one): says whether it
		// can open /dev/tty, then starts "tty-open" as a tree and relays
		// what the tool says.
		if f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0); err == nil {
			f.Close()
			fmt.Println("owner: tty open")
		} else {
			fmt.Println("owner: tty refused:", err)
		}
		tree, sc, ok := helperTree("tty-open")
		if !ok {
			return 1
		}
		if sc.Scan() {
			fmt.Println(sc.Text())
		}
		tree.Wait()
		return 0
	case "subreaper":
		// A process that adopts orphans, as a container's PID 1 does,
		// reaping them: runs trees whose roots leave a child behind and
		// exit, then says how many zombies it is the parent of, and
		// whether each root's own exit status was still its own.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Println("error", err)
			return 1
		}
		ReapAdopted(true)
		for range 10 {
			// A child left behind, killed with the tree once the root
			// has exited: an orphan, adopted, dead.
			tree, err := Start(context.Background(), exec.Command("sh", "-c", "sleep 0.3 & sleep 0.1; exit 0"), Auto)
			if err != nil {
				fmt.Println("error", err)
				return 1
			}
			// The root is reaped by Tree.Wait, not the reaper.
			if err := tree.Wait(); err != nil && strings.Contains(err.Error(), "no child processes") {
				fmt.Println("root's wait:", err)
			}
		}
		time.Sleep(2500 * time.Millisecond) // the orphans die at 0.1s; the reaper looks every second
		zombies := 0
		ps, _ := pids()
		for _, pid := range ps {
			if st, err := readStat(pid); err == nil && st.ppid == os.Getpid() && st.state == 'Z' {
				zombies++
			}
		}
		fmt.Println("zombies", zombies)
		return 0
	case "tty-open":
		if f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0); err == nil {
			f.Close()
			fmt.Println("tool: tty open")
		} else {
			fmt.Println("tool: tty refused")
		}
		return 0
	case "setsid-child", "leave-child":
		c := exec.Command(self(), helperArg, "hang")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println(c.Process.Pid)
		if mode == "leave-child" {
			return 0
		}
		time.Sleep(time.Hour)
	case "escape-cgroup", "escape-and-exit":
		// A tool that tries to leave its tree: says which cgroup it sees
		// itself in, then starts an "escapee" in a session of its own.
		b, _ := os.ReadFile("/proc/self/cgroup")
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "0::") {
				fmt.Print("cg ", line)
			}
		}
		c := exec.Command(self(), helperArg, "escapee")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		c.Stdout = os.Stdout
		if err := c.Start(); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if mode == "escape-and-exit" {
			// Ends on its own once its escapee has moved.
			os.Stdin.Read(make([]byte, 1))
			return 0
		}
		time.Sleep(time.Hour)
	case "escapee":
		// Ignores SIGTERM and writes itself into the cgroup named by
		// TB_ESCAPE_TO (the hierarchy's root), as root can.
		signal.Ignore(syscall.SIGTERM)
		err := os.WriteFile(os.Getenv("TB_ESCAPE_TO"), []byte(strconv.Itoa(os.Getpid())), 0)
		fmt.Println("pid", os.Getpid())
		if err != nil {
			fmt.Println("refused", err)
		} else {
			fmt.Println("moved")
		}
		time.Sleep(time.Hour)
	}
	return 2
}

// helperTree starts the helper in mode as a tree (Auto), as an owner
// helper does, with a scanner of its stdout; false, having said why, when
// it could not.
func helperTree(mode string) (*Tree, *bufio.Scanner, bool) {
	cmd := exec.Command(self(), helperArg, mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, false
	}
	tree, err := Start(context.Background(), cmd, Auto)
	if err != nil {
		fmt.Println("error", err)
		return nil, nil, false
	}
	return tree, bufio.NewScanner(out), true
}

func self() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}

func forEachStrategy(t *testing.T, f func(t *testing.T, s Strategy)) {
	t.Helper()
	for _, s := range []Strategy{Cgroup, Track} {
		t.Run(string(s), func(t *testing.T) {
			if _, err := Resolve(s); err != nil {
				t.Skip(err)
			}
			t.Cleanup(func() { noLeaks(t) })
			f(t, s)
		})
	}
}

// noLeaks is internal/proctest's check, which cannot be imported here.
func noLeaks(t *testing.T) {
	t.Helper()
	var left []Process
	if !pollUntil(time.Now().Add(3*time.Second), func() bool {
		var err error
		left, err = Running()
		return err == nil && len(left) == 0
	}) {
		t.Errorf("processes outlived their tree: %v", left)
	}
}

// started is a helper started as the root of a tree, and its stdout lines.
type started struct {
	tree  *Tree
	lines *bufio.Scanner
}

func start(t *testing.T, s Strategy, mode string) started {
	t.Helper()
	cmd := exec.Command(self(), helperArg, mode)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	tree, err := Start(t.Context(), cmd, s)
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tree.Wait()
		r.Close()
	})
	if tree.Strategy() != s {
		t.Errorf("strategy %s, want %s", tree.Strategy(), s)
	}
	return started{tree: tree, lines: bufio.NewScanner(r)}
}

func (st started) line(t *testing.T) string {
	t.Helper()
	if !st.lines.Scan() {
		t.Fatalf("the helper said nothing: %v", st.lines.Err())
	}
	return st.lines.Text()
}

func (st started) pid(t *testing.T) int {
	t.Helper()
	l := st.line(t)
	pid, err := strconv.Atoi(l)
	if err != nil {
		t.Fatalf("not a pid: %q", l)
	}
	return pid
}

func TestMarkerAndProcessGroup(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "env")
		if got := st.line(t); got != st.tree.Marker() || !strings.HasPrefix(got, Instance()+"-") {
			t.Errorf("marker %q, tree says %q", got, st.tree.Marker())
		}
		ps, err := readStat(st.tree.PID())
		if err != nil || ps.pgrp != st.tree.PID() {
			t.Errorf("the root's process group is %d (%v), want its own, %d", ps.pgrp, err, st.tree.PID())
		}
		// A session of its own, without timebox's terminal (a tool in
		// timebox's session could type into it).
		if sid, err := unix.Getsid(st.tree.PID()); err != nil || sid != st.tree.PID() {
			t.Errorf("the root's session is %d (%v), want its own, %d", sid, err, st.tree.PID())
		}
		procs, err := Running()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range procs {
			found = found || (p.PID == st.tree.PID() && p.Marker == st.tree.Marker())
		}
		if !found {
			t.Errorf("Running does not list the live root: %v", procs)
		}
		st.tree.Stop(time.Second)
		if err := st.tree.Wait(); err == nil {
			t.Error("a stopped process reports success")
		}
	})
}

// TestAToolHasNoTerminal: a tool started by a timebox that runs on a
// terminal cannot open it (/dev/tty), so it cannot type into the shell
// that started timebox, answer its approval prompt, or stop it by taking
// the terminal's foreground.
func TestAToolHasNoTerminal(t *testing.T) {
	master, tty := testenv.PTY(t)
	owner := exec.Command(self(), helperArg, "tty-owner")
	owner.Stdin, owner.Stdout, owner.Stderr = tty, tty, tty
	owner.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(20 * time.Second): // a deadline, not a wait
			owner.Process.Kill()
			master.Close()
		}
	}()
	var said []string
	sc := bufio.NewScanner(master)
	for len(said) < 2 && sc.Scan() {
		said = append(said, strings.TrimRight(sc.Text(), "\r"))
	}
	owner.Wait()
	if len(said) != 2 || said[0] != "owner: tty open" {
		t.Fatalf("the owner said %q", said)
	}
	if said[1] != "tool: tty refused" {
		t.Errorf("the tool said %q: it could open timebox's terminal", said[1])
	}
	noLeaks(t)
}

// TestOrphansAreReapedAsInit: a process that adopts the orphans of its
// tools (a container's PID 1) reaps them with ReapAdopted, and the roots
// of its trees keep their exit status (Tree.Wait reaps them).
func TestOrphansAreReapedAsInit(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		cmd := exec.Command(self(), helperArg, "subreaper")
		cmd.Env = append(os.Environ(), EnvStrategy+"="+string(s))
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "zombies 0" {
			t.Fatalf("%s (%v)", out, err)
		}
	})
}

func TestStopReachesEscapedChild(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "setsid-child")
		child := st.pid(t)
		st.tree.Stop(time.Second)
		if pidAlive(child) || pidAlive(st.tree.PID()) {
			t.Errorf("alive after Stop: child %v, root %v", pidAlive(child), pidAlive(st.tree.PID()))
		}
		var ee *exec.ExitError
		if err := st.tree.Wait(); !errors.As(err, &ee) {
			t.Errorf("Wait: %v, want the root's exit error", err)
		}
		if err := st.tree.Wait(); !errors.As(err, &ee) {
			t.Errorf("a second Wait: %v", err)
		}
	})
}

// TestAPrivilegedProcessCannotLeave: a tool's process that writes itself
// into another cgroup (root may) and ignores SIGTERM is still stopped with
// its call, within the kill grace: found by its marker outside the cgroup.
// Where the root runs in a cgroup namespace of its own, it sees its call's
// cgroup as "/", and with nsdelegate the kernel refuses the move itself.
func TestAPrivilegedProcessCannotLeave(t *testing.T) {
	rootProcs := escapeTarget(t)
	t.Cleanup(func() { noLeaks(t) })
	host, _ := cgHost()
	t.Setenv("TB_ESCAPE_TO", rootProcs)
	st := start(t, Cgroup, "escape-cgroup")
	var escapee int
	var cg, outcome string
	for escapee == 0 || outcome == "" {
		l := st.line(t)
		switch {
		case strings.HasPrefix(l, "cg "):
			cg = strings.TrimPrefix(l, "cg ")
		case strings.HasPrefix(l, "pid "):
			escapee, _ = strconv.Atoi(strings.TrimPrefix(l, "pid "))
		case l == "moved" || strings.HasPrefix(l, "refused"):
			outcome = l
		}
	}
	t.Logf("the tool saw itself in %q; its escapee: %s", cg, outcome)
	if host.ownNS && cg != "0::/" {
		t.Errorf("with a cgroup namespace of its own, the tool sees itself in %q, want 0::/", cg)
	}
	if host.ownNS && nsDelegate(host.base) && outcome == "moved" {
		t.Error("in a cgroup namespace on an nsdelegate mount, the kernel let the escapee out")
	}
	stopped := time.Now()
	st.tree.Stop(500 * time.Millisecond)
	st.tree.Wait()
	if !pollUntil(time.Now().Add(time.Second), func() bool { return !pidAlive(escapee) }) {
		t.Fatalf("the escapee (%s) is alive after its call was stopped and waited for", outcome)
	}
	if took := time.Since(stopped); took > 500*time.Millisecond+unkillableAfter {
		t.Errorf("stopping took %s", took)
	}
	if esc := st.tree.Escaped(); outcome == "moved" && !slices.Contains(esc, escapee) {
		t.Errorf("Escaped() = %v, want the escapee %d", esc, escapee)
	}
}

// TestAnEscapeeOfACallThatEndedIsStopped: a call that ends on its own does
// not wait for a look for escapees, but one is made for it shortly after
// (the sweeper), and what left the cgroup is stopped.
func TestAnEscapeeOfACallThatEndedIsStopped(t *testing.T) {
	rootProcs := escapeTarget(t)
	t.Setenv("TB_ESCAPE_TO", rootProcs)
	cmd := exec.Command(self(), helperArg, "escape-and-exit")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	in, release, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stdin = w, in
	tree, err := Start(t.Context(), cmd, Cgroup)
	w.Close()
	in.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noLeaks(t) })
	defer r.Close()
	lines := bufio.NewScanner(r)
	escapee, moved := 0, false
	for escapee == 0 || !moved {
		if !lines.Scan() {
			t.Fatal("the helper said nothing more")
		}
		l := lines.Text()
		switch {
		case strings.HasPrefix(l, "pid "):
			escapee, _ = strconv.Atoi(strings.TrimPrefix(l, "pid "))
		case l == "moved":
			moved = true
		case strings.HasPrefix(l, "refused"):
			release.Close()
			tree.Wait()
			t.Skipf("the kernel refused the move (%s): nothing escaped", l)
		}
	}
	before := EscapedTotal()
	release.Close() // the root exits
	<-tree.Exited()
	if err := tree.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !pollUntil(time.Now().Add(2*time.Second), func() bool { return !pidAlive(escapee) }) {
		t.Fatal("the escapee of a call that ended is alive 2s later")
	}
	if !pollUntil(time.Now().Add(time.Second), func() bool { return EscapedTotal() > before }) {
		t.Error("EscapedTotal did not count it")
	}
}

// escapeTarget returns the cgroup.procs of the hierarchy's root, skipping
// t where a process cannot be moved there.
func escapeTarget(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("moving a process to the root cgroup needs root")
	}
	if _, err := Resolve(Cgroup); err != nil {
		t.Skip(err)
	}
	host, _ := cgHost()
	mounts, err := cgroup2Mounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.root == "/" && strings.HasPrefix(host.base, m.point) {
			return filepath.Join(m.point, "cgroup.procs")
		}
	}
	t.Skip("this process does not see the cgroup hierarchy's root")
	return ""
}

func TestWaitKillsLeftovers(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "leave-child")
		child := st.pid(t)
		<-st.tree.Exited()
		if !pidAlive(child) {
			t.Fatal("the child is gone before Wait; the test proves nothing")
		}
		if err := st.tree.Wait(); err != nil {
			t.Errorf("Wait: %v, want the root's success", err)
		}
		if pidAlive(child) {
			t.Error("the child outlived Wait")
		}
	})
}

func TestSIGTERMOnce(t *testing.T) {
	// The tracking strategy signals the process group and then each
	// process it finds: a process in the group must get SIGTERM once.
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "count-term")
		st.line(t) // ready
		// A process that started in the very clock tick of the group
		// signal may be signalled twice (refreshGroup); this one has been
		// in the group since an earlier tick, as a running tool has.
		nextTick(t)
		st.tree.Stop(5 * time.Second)
		n := 0
		for st.lines.Scan() {
			if st.lines.Text() == "TERM" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("SIGTERM delivered %d times, want 1", n)
		}
		if err := st.tree.Wait(); err != nil {
			t.Errorf("Wait: %v (the helper exits 0 on SIGTERM)", err)
		}
	})
}

func TestLateChildGetsSIGTERM(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "term-spawns")
		st.line(t)
		t0 := time.Now()
		st.tree.Stop(10 * time.Second)
		if d := time.Since(t0); d > 3*time.Second {
			t.Errorf("Stop took %s: the child started after SIGTERM was not sent it", d)
		}
		if err := st.tree.Wait(); err != nil {
			t.Errorf("Wait: %v (the helper exits 0 once its child is gone)", err)
		}
	})
}

// A process that joined the group after the group was signalled (forked
// between the group's kill and the scan that follows it) gets the signal
// on its own; one that was there before does not get it twice. The race
// itself is a few microseconds wide; this test sets it up by hand: the
// group signal "happened" at tick `before`, the child started two ticks
// later.
func TestGroupSignalReachesLateMembers(t *testing.T) {
	if _, err := Resolve(Track); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { noLeaks(t) })
	st := start(t, Track, "spawn-on-usr1")
	lines := make(chan string, 16)
	go func() {
		for st.lines.Scan() {
			lines <- st.lines.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l := <-lines:
			return l
		case <-time.After(10 * time.Second):
			t.Fatalf("no line from the helpers while waiting for %s", what)
		}
		return ""
	}
	if l := next("the root's ready"); l != "ready" {
		t.Fatalf("root said %q", l)
	}
	// The root started in an earlier tick than the group signal, as a
	// running tool's root has (on a quick machine it is ready within
	// its first tick).
	nextTick(t)
	before := bootTicks()
	if !pollUntil(time.Now().Add(5*time.Second), func() bool { return bootTicks() >= before+2 }) {
		t.Fatal("the boot clock does not move")
	}
	unix.Kill(st.tree.PID(), unix.SIGUSR1)
	if l := next("the child's ready"); l != "ready" {
		t.Fatalf("child said %q", l)
	}

	st.tree.mu.Lock()
	st.tree.refreshGroup(unix.SIGTERM, before)
	st.tree.mu.Unlock()
	if l := next("the child's TERM"); l != "TERM" {
		t.Fatalf("after the scan the helpers said %q, want the child's TERM (and nothing from the root)", l)
	}
	st.tree.Stop(0)
	st.tree.Wait()
}

func TestStopGrace(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		for _, grace := range []time.Duration{0, 200 * time.Millisecond} {
			st := start(t, s, "ignore-term")
			st.line(t)
			t0 := time.Now()
			st.tree.Stop(grace)
			if d := time.Since(t0); d < grace || d > grace+time.Second {
				t.Errorf("grace %s: Stop took %s", grace, d)
			}
			if pidAlive(st.tree.PID()) {
				t.Errorf("grace %s: the root is alive after Stop", grace)
			}
		}
	})
}

func TestCgroupDirectories(t *testing.T) {
	host, err := cgHost()
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { noLeaks(t) })
	st := start(t, Cgroup, "hang")
	st.line(t)
	call := st.tree.cg.dir
	b, _ := os.ReadFile(call + "/cgroup.procs")
	if strings.TrimSpace(string(b)) != strconv.Itoa(st.tree.PID()) {
		t.Errorf("cgroup.procs %q, want the root %d", b, st.tree.PID())
	}
	st.tree.Stop(time.Second)
	st.tree.Wait()

	// The empty cgroup is kept for the next call, which reuses it.
	next := start(t, Cgroup, "hang")
	next.line(t)
	if next.tree.cg.dir != call {
		t.Errorf("the next call made %s instead of reusing %s", next.tree.cg.dir, call)
	}
	next.tree.Stop(0)
	next.tree.Wait()

	Close()
	host.mu.Lock()
	active := host.active
	host.mu.Unlock()
	if active == 0 {
		for _, dir := range []string{call, host.parent} {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s is still there after Close with no call running: %v", dir, err)
			}
		}
	}
}

// A stop waits for its cgroup to empty in Go's poller, woken by the kernel
// when cgroup.events changes: it reads the file a few times, not every few
// milliseconds as the polling fallback would (about 35 times in 300ms).
func TestCgroupEmptyWakesThePoller(t *testing.T) {
	if _, err := Resolve(Cgroup); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { noLeaks(t) })
	st := start(t, Cgroup, "hang")
	st.line(t)
	if st.tree.cg.eventsConn == nil {
		t.Fatal("cgroup.events is not in the poller")
	}
	killer := time.AfterFunc(300*time.Millisecond, func() { unix.Kill(st.tree.PID(), unix.SIGKILL) })
	defer killer.Stop()
	before := eventsReads.Load()
	if !st.tree.cg.waitEmpty(time.Now().Add(10 * time.Second)) {
		t.Fatal("the cgroup did not empty within 10s of its only process being killed")
	}
	if n := eventsReads.Load() - before; n > 6 {
		t.Errorf("cgroup.events read %d times while waiting; the poller should wake the wait once or twice", n)
	}
	st.tree.Wait()
}

func TestScansAreShared(t *testing.T) {
	// Fake calls with no processes: a scan has something to look for.
	for n := uint64(1 << 60); n < 1<<60+10; n++ {
		pgid := -int(n%1000) - 2
		trk.add(n, pgid)
		defer trk.remove(pgid)
	}
	// 100 requests arrive while a scan is under way (set up by hand: on a
	// quick machine a real scan may end before the next request comes);
	// when it ends, one scan serves all of them.
	trk.mu.Lock()
	trk.busy = true
	trk.mu.Unlock()
	before := scans.Load()
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			if got := trk.members(1<<60 + uint64(i%10)); len(got) != 0 {
				t.Errorf("members of a fake call: %v", got)
			}
		})
	}
	queued := func() int {
		trk.mu.Lock()
		defer trk.mu.Unlock()
		return len(trk.queued)
	}
	if !pollUntil(time.Now().Add(10*time.Second), func() bool { return queued() == 100 }) {
		t.Fatalf("%d of 100 requests queued behind the scan under way", queued())
	}
	// The scan under way ends as members ends one: the first in line
	// leads the next.
	trk.mu.Lock()
	next := trk.queued[0]
	trk.queued = trk.queued[1:]
	next.ch <- nil
	trk.mu.Unlock()
	wg.Wait()
	if n := scans.Load() - before; n != 1 {
		t.Errorf("%d scans for 100 requests queued behind one, want 1", n)
	}
}

// nextTick waits until the boot clock (/proc/<pid>/stat's start times) has
// moved on from now.
func nextTick(t *testing.T) {
	t.Helper()
	now := bootTicks()
	if !pollUntil(time.Now().Add(5*time.Second), func() bool { return bootTicks() > now }) {
		t.Fatal("the boot clock does not move")
	}
}

func TestScanFindsMarkedProcess(t *testing.T) {
	// A process outside every tracked group that carries the marker of a
	// tracked call is found for that call, and for no other.
	t.Cleanup(func() { noLeaks(t) })
	const n, other = 1<<61 + 1, 1<<61 + 2
	trk.add(n, -3)
	trk.add(other, -4)
	defer trk.remove(-3)
	defer trk.remove(-4)
	cmd := exec.Command(self(), helperArg, "hang")
	cmd.Env = withMarker(nil, markerValue(n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
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
	// Scan once it has exec'd: before that it carries this process's
	// environment, without the marker, and a scan then would remember it
	// as a stranger for as long as its pid names it (a tool's processes
	// inherit the marker from the root, which is found by its group).
	bufio.NewScanner(out).Scan()
	found := func(c uint64) bool {
		ok := false
		for _, r := range trk.members(c) {
			ok = ok || (r.pid == cmd.Process.Pid && !r.inGroup)
			closeFD(r.fd)
		}
		return ok
	}
	if !pollUntil(time.Now().Add(5*time.Second), func() bool { return found(n) }) {
		t.Fatal("the marked process was not found")
	}
	if found(other) {
		t.Error("the marked process was found for another call")
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 12345 678 18446744073709551615\n"
	st, err := parseStat([]byte(line))
	if err != nil || st.state != 'S' || st.pgrp != 1234 || st.start != 987654 {
		t.Errorf("%+v %v", st, err)
	}
	if _, err := parseStat([]byte("1 (x) S 1")); err == nil {
		t.Error("a short stat parsed")
	}
	if !(procStat{state: 'Z'}).gone() || (procStat{state: 'D'}).gone() {
		t.Error("gone")
	}
}

func TestMarkers(t *testing.T) {
	t.Setenv(EnvMarker, "outer0000000-5")
	v := markerValue(7)
	if want := Instance() + "-7,outer0000000-5"; v != want {
		t.Errorf("marker %q, want %q", v, want)
	}
	for value, want := range map[string]int64{
		v:                               7,
		"other-1," + Instance() + "-9":  9,
		"other-1":                       -1,
		Instance() + "-x":               -1,
		"":                              -1,
		Instance() + "-12,other-3,junk": 12,
	} {
		n, ok := callOf(value)
		if (want < 0 && ok) || (want >= 0 && (!ok || n != uint64(want))) {
			t.Errorf("callOf(%q) = %d, %v; want %d", value, n, ok, want)
		}
	}
	env := withMarker([]string{"A=1", EnvMarker + "=stale", "B=2"}, "m-1")
	if strings.Join(env, " ") != "A=1 B=2 "+EnvMarker+"=m-1" {
		t.Errorf("env %v", env)
	}
	if v, ok := markerIn([]byte("A=1\x00" + EnvMarker + "=abc-3\x00B=2\x00")); !ok || v != "abc-3" {
		t.Errorf("markerIn: %q %v", v, ok)
	}
	if _, ok := markerIn([]byte("X" + EnvMarker + "=abc-3\x00")); ok {
		t.Error("markerIn matched inside another variable")
	}
}

func TestStrategySelection(t *testing.T) {
	for in, want := range map[string]Strategy{"": Auto, "auto": Auto, "cgroup": Cgroup, "track": Track} {
		if got, err := ParseStrategy(in); err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseStrategy("cgroups"); err == nil {
		t.Error("cgroups parsed")
	}

	t.Setenv(EnvStrategy, "bogus")
	if err := Check(os.Getenv(EnvStrategy)); err == nil || !strings.Contains(err.Error(), "TIMEBOX_PROCTREE") {
		t.Errorf("Check: %v, want an error naming the variable", err)
	}
	if _, err := Resolve(Auto); err == nil || !strings.Contains(err.Error(), "TIMEBOX_PROCTREE") {
		t.Errorf("Resolve(auto): %v, want an error naming the variable", err)
	}
	if s, err := Resolve(Track); err != nil || s != Track {
		t.Errorf("an explicit strategy must win over the variable: %s %v", s, err)
	}

	t.Setenv(EnvStrategy, "track")
	if err := Check(os.Getenv(EnvStrategy)); err != nil {
		t.Error(err)
	}
	if s, err := Resolve(Auto); err != nil || s != Track {
		t.Errorf("Resolve(auto) with track forced: %s %v", s, err)
	}

	t.Setenv(EnvStrategy, "cgroup")
	usable := cgroupUsable()
	if err := Check(os.Getenv(EnvStrategy)); (err == nil) != (usable == nil) {
		t.Errorf("Check with cgroup forced: %v (usable: %v)", err, usable)
	}

	t.Setenv(EnvStrategy, "")
	want := Track
	if usable == nil {
		want = Cgroup
	}
	if s, err := Resolve(""); err != nil || s != want {
		t.Errorf("auto-detected %s %v, want %s", s, err, want)
	}
}
