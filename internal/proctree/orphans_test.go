//go:build linux

package proctree

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// errLate is the cause the tests stop a start with.
var errLate = errors.New("the deadline passed")

func TestStartChecksTheContextRightBeforeTheFork(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		t.Run("done while its own start is next", func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			// The hook runs on the starter's thread after the request
			// was taken: the last instant before the fork.
			hook := func() { cancel(errLate) }
			starts.hook.Store(&hook)
			defer starts.hook.Store(nil)
			cmd := exec.Command(self(), helperArg, "hang")
			tree, err := Start(ctx, cmd, s)
			if tree != nil {
				tree.Stop(0)
				tree.Wait()
			}
			if !errors.Is(err, ErrNotStarted) || !errors.Is(err, errLate) || tree != nil || cmd.Process != nil {
				t.Fatalf("Start = %v, %v (process %v); want ErrNotStarted with the cause, and nothing started", tree, err, cmd.Process)
			}
		})
		t.Run("done while queued behind another start", func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hook := func() {
				once.Do(func() {
					close(entered)
					<-release
				})
			}
			starts.hook.Store(&hook)
			defer starts.hook.Store(nil)
			first := make(chan started, 1)
			go func() {
				cmd := exec.Command(self(), helperArg, "hang")
				tree, err := Start(context.Background(), cmd, s)
				if err != nil {
					t.Error(err)
				}
				first <- started{tree: tree}
			}()
			<-entered
			// Never deadlock: the first start goes on after 3s anyway.
			unblock := time.AfterFunc(3*time.Second, func() { closeOnce(release) })
			defer unblock.Stop()
			ctx, cancel := context.WithCancelCause(t.Context())
			go func() {
				time.Sleep(50 * time.Millisecond)
				cancel(errLate)
			}()
			cmd := exec.Command(self(), helperArg, "hang")
			t0 := time.Now()
			tree, err := Start(ctx, cmd, s)
			if tree != nil {
				tree.Stop(0)
				tree.Wait()
			}
			if !errors.Is(err, ErrNotStarted) || !errors.Is(err, errLate) || tree != nil || cmd.Process != nil {
				t.Errorf("Start = %v, %v; want ErrNotStarted with the cause, and nothing started", tree, err)
			}
			if d := time.Since(t0); d > 2*time.Second {
				t.Errorf("a cancelled start waited %s for the one before it", d)
			}
			closeOnce(release)
			if st := <-first; st.tree != nil {
				st.tree.Stop(0)
				st.tree.Wait()
			}
		})
	})
}

var closeMu sync.Mutex

// closeOnce closes c unless it is closed already.
func closeOnce(c chan struct{}) {
	closeMu.Lock()
	defer closeMu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

// ownTree starts the "own-tree" helper, a stand-in for a timebox process
// running one tool, and returns it with the pids of its tree's root and of
// the root's setsid child.
func ownTree(t *testing.T, s Strategy) (owner *exec.Cmd, root, grandchild int) {
	t.Helper()
	owner = exec.Command(self(), helperArg, "own-tree")
	owner.Env = append(os.Environ(), EnvStrategy+"="+string(s))
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		owner.Process.Kill()
		owner.Wait()
	})
	sc := bufio.NewScanner(out)
	var pids []int
	for len(pids) < 2 && sc.Scan() {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil {
			t.Fatalf("the owner said %q", sc.Text())
		}
		pids = append(pids, pid)
	}
	if len(pids) < 2 {
		t.Fatalf("the owner said only %v: %v", pids, sc.Err())
	}
	return owner, pids[0], pids[1]
}

// TestOwnerKilledThenReaped kills an owner with SIGKILL: its tree's root
// dies with it (Pdeathsig), the root's setsid child does not, and
// ReapOrphans in another process stops it.
func TestOwnerKilledThenReaped(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		owner, root, grandchild := ownTree(t, s)
		t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })
		owner.Process.Kill()
		owner.Wait()
		if !pollUntil(time.Now().Add(5*time.Second), func() bool { return !pidAlive(root) }) {
			t.Fatalf("the root %d outlived its owner: no parent-death signal", root)
		}
		if !pidAlive(grandchild) {
			t.Fatal("the setsid grandchild died with its owner; the test proves nothing more")
		}
		if s == Cgroup {
			// What a test that started the owner sees of what it left.
			if left, err := CgroupMembers(owner.Process.Pid); err != nil || !slices.Contains(left, grandchild) {
				t.Errorf("CgroupMembers of the dead owner = %v, %v; want its grandchild %d", left, err, grandchild)
			}
		}
		r, err := ReapOrphans()
		if err != nil {
			t.Error(err)
		}
		if !pollUntil(time.Now().Add(5*time.Second), func() bool { return !pidAlive(grandchild) }) {
			t.Fatalf("the grandchild %d is alive after ReapOrphans (%+v)", grandchild, r)
		}
		if r.Processes < 1 || !slices.Contains(r.Owners, owner.Process.Pid) {
			t.Errorf("ReapOrphans = %+v; want at least 1 process of owner %d", r, owner.Process.Pid)
		}
		if s == Cgroup {
			host, _ := cgHost()
			matches, _ := filepath.Glob(filepath.Join(host.base, parentPrefix+strconv.Itoa(owner.Process.Pid)+".*"))
			if len(matches) > 0 {
				t.Errorf("the dead owner's cgroups are still there: %v", matches)
			}
			if left, err := CgroupMembers(owner.Process.Pid); len(left) > 0 || err != nil {
				t.Errorf("CgroupMembers after the reap = %v, %v", left, err)
			}
		}
	})
}

// TestReapOnlyWhatDeadOwnersLeft starts processes carrying markers of
// every kind: only those whose own call's owner is provably gone are
// killed.
func TestReapOnlyWhatDeadOwnersLeft(t *testing.T) {
	st, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := pidNamespace()
	if err != nil {
		t.Skip(err)
	}
	live := exec.Command(self(), helperArg, "hang")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		live.Process.Kill()
		live.Wait()
	}()
	var liveStart uint64
	pollUntil(time.Now().Add(5*time.Second), func() bool {
		ls, err := readStat(live.Process.Pid)
		liveStart = ls.start
		return err == nil
	})
	inst := func(pid int, start, ns uint64) string { return fmt.Sprintf("%d.%d.%d", pid, start, ns) }
	dead := inst(os.Getpid(), st.start+1, ns) // this pid, another start: reused
	cases := []struct {
		name   string
		marker string
		reaped bool
	}{
		{"dead owner", dead + "-3", true},
		{"dead owner, nested in a live one", dead + "-3," + inst(live.Process.Pid, liveStart, ns) + "-1", true},
		{"live owner", inst(live.Process.Pid, liveStart, ns) + "-1", false},
		{"live owner, nested in a dead one", inst(live.Process.Pid, liveStart, ns) + "-1," + dead + "-2", false},
		{"this process", Instance() + "-99", false},
		{"another pid namespace", inst(os.Getpid(), st.start+1, ns+1) + "-1", false},
		{"random instance", "r0123456789ab-1", false},
		{"older version", "0123456789ab-1", false},
		{"malformed", dead, false},
	}
	// Every timebox process starting on this machine reaps what dead
	// owners left, these test processes too (other packages' tests start
	// timebox binaries): hold the reaping lock until this test has reaped,
	// so that the count is this test's.
	unlock := lockReaping()
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	var procs []int
	for _, tc := range cases {
		cmd := exec.Command(self(), helperArg, "hang")
		cmd.Env = append(os.Environ(), EnvMarker+"="+tc.marker)
		r, err := cmd.StdoutPipe()
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
		bufio.NewScanner(r).Scan() // "ready": its environment is readable
		procs = append(procs, cmd.Process.Pid)
	}
	got, err := reapLocked()
	unlock()
	unlock = nil
	if err != nil {
		t.Error(err)
	}
	// ReapOrphans waits for what it killed to exit.
	for i, tc := range cases {
		if alive := pidAlive(procs[i]); alive == tc.reaped {
			t.Errorf("%s: marker %q: reaped %v, want %v", tc.name, tc.marker, !alive, tc.reaped)
		}
	}
	// At least this test's two: what other packages' tests left at the
	// same moment (a timebox killed with SIGKILL on purpose) is reaped
	// too, and the cases above say which of this test's were.
	if got.Processes < 2 {
		t.Errorf("ReapOrphans = %+v, want this test's 2 processes", got)
	}
}

// TestUnkillableProcessIsNotWaitedForEver freezes a tree's root in a v1
// freezer cgroup, where SIGKILL stays pending (state D) until it is
// thawed: Stop and Wait give up after unkillableAfter and count it, and
// the tree is finished once it exits.
func TestUnkillableProcessIsNotWaitedForEver(t *testing.T) {
	const freezer = "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(freezer + "/cgroup.procs"); err != nil {
		t.Skip("no v1 freezer hierarchy to make a process unkillable:", err)
	}
	dir := filepath.Join(freezer, "timebox-test-"+Instance())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skip("cannot make a freezer cgroup:", err)
	}
	defer os.Remove(dir)
	defer os.WriteFile(dir+"/freezer.state", []byte("THAWED"), 0)
	defer func(d time.Duration) { unkillableAfter = d }(unkillableAfter)
	unkillableAfter = 300 * time.Millisecond
	forEachStrategy(t, func(t *testing.T, s Strategy) {
		st := start(t, s, "hang")
		st.line(t)
		pid := st.tree.PID()
		if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Skip("cannot move a process into the freezer cgroup:", err)
		}
		if err := os.WriteFile(dir+"/freezer.state", []byte("FROZEN"), 0); err != nil {
			t.Fatal(err)
		}
		pollUntil(time.Now().Add(5*time.Second), func() bool {
			b, _ := os.ReadFile(dir + "/freezer.state")
			return strings.TrimSpace(string(b)) == "FROZEN"
		})
		before := UnkilledRunning()
		done := make(chan error, 1)
		go func() {
			st.tree.Stop(0)
			done <- st.tree.Wait()
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "did not exit") {
				t.Errorf("Wait: %v, want an error saying the root did not exit", err)
			}
		case <-time.After(5 * time.Second):
			os.WriteFile(dir+"/freezer.state", []byte("THAWED"), 0)
			t.Fatal("Stop and Wait are still waiting for a process that cannot die")
		}
		if got := st.tree.Unkilled(); !slices.Equal(got, []int{pid}) {
			t.Errorf("Unkilled() = %v, want [%d]", got, pid)
		}
		if n := UnkilledRunning() - before; n != 1 {
			t.Errorf("UnkilledRunning went up by %d, want 1", n)
		}
		os.WriteFile(dir+"/freezer.state", []byte("THAWED"), 0)
		if !pollUntil(time.Now().Add(5*time.Second), func() bool { return UnkilledRunning() == before }) {
			t.Errorf("UnkilledRunning stays at %d after the process could exit", UnkilledRunning())
		}
	})
}

// TestCgroupPoolFollowsConcurrency keeps as many idle cgroups as calls ran
// at once (more than the old fixed 32), and lets the pool shrink once the
// peak is two windows old.
func TestCgroupPoolFollowsConcurrency(t *testing.T) {
	host, err := cgHost()
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { noLeaks(t) })
	Close()
	const n = 40
	trees := make([]*Tree, n)
	for i := range trees {
		tree, err := Start(t.Context(), exec.Command("sleep", "1000"), Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		trees[i] = tree
	}
	for _, tree := range trees {
		// SIGTERM ends sleep; a cgroup that needed cgroup.kill is not
		// reused.
		tree.Stop(5 * time.Second)
		tree.Wait()
	}
	host.mu.Lock()
	idle := len(host.idle)
	host.mu.Unlock()
	if idle != n {
		t.Errorf("%d idle cgroups after %d calls at once, want %d", idle, n, n)
	}
	// Two windows later, with one call at a time, the pool shrinks.
	host.mu.Lock()
	host.window = time.Now().Add(-3 * idleLinger)
	host.mu.Unlock()
	for range 2 {
		tree, err := Start(t.Context(), exec.Command("true"), Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		tree.Wait()
		host.mu.Lock()
		host.window = time.Now().Add(-3 * idleLinger)
		host.mu.Unlock()
	}
	host.mu.Lock()
	idle = len(host.idle)
	host.mu.Unlock()
	if idle > 2 {
		t.Errorf("%d idle cgroups kept after the burst's windows passed, want at most 2", idle)
	}
}

// TestReapingIsOneAtATimeOnTheMachine: while one timebox process reaps,
// another that starts waits for it instead of killing (and counting) the
// same orphans.
func TestReapingIsOneAtATimeOnTheMachine(t *testing.T) {
	unlock := lockReaping()
	other := exec.Command(self(), helperArg, "reap")
	r, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; l != "ready" {
		unlock()
		t.Fatalf("the other process said %q", l)
	}
	// It must not finish while the lock is held. Half a second is what
	// an unserialised reap (nothing to reap here) takes many times over.
	select {
	case l := <-lines:
		t.Errorf("the other process said %q while this one held the reaping lock", l)
	case <-time.After(500 * time.Millisecond):
	}
	unlock()
	select {
	case l := <-lines:
		if l != "reaped" {
			t.Errorf("the other process said %q, want reaped", l)
		}
	case <-time.After(30 * time.Second):
		other.Process.Kill()
		t.Fatal("the other process did not reap within 30s of the lock's release")
	}
}
