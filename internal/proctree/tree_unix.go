//go:build linux || darwin

package proctree

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Tree is the process tree of one started command: its root process and
// every process started under it. Exited is safe for concurrent use; Stop
// and Wait serialise with each other.
type Tree struct {
	cmd      *exec.Cmd
	strategy Strategy
	n        uint64
	marker   string
	pid      int
	exited   chan struct{}

	cg *callCgroup // Cgroup

	mu      sync.Mutex
	members map[int]*handle // every process held so far, by pid
	// signalled are the pids of a cgroup's tree that were sent SIGTERM,
	// by the group signal or on their own.
	signalled map[int]bool
	gone      bool // a check found no live member after the root exited
	// unkilled are the processes still alive unkillableAfter after they
	// were sent SIGKILL; the tree no longer waits for them.
	unkilled []int
	// escapees are the processes of a cgroup's tree found outside its
	// cgroup, by the call's marker (sweepEscapees); swept tells that the
	// tree looked for them after its cgroup was empty.
	escapees []int
	swept    bool
	waited   bool
	err      error
}

// unkillableAfter is how long a tree waits for its processes to exit once
// they were all sent SIGKILL. A process cannot catch, block or survive
// SIGKILL, and runs no code of its own once it is sent; but one in
// uninterruptible sleep (state D: a hung network file system, a stuck
// device, a frozen v1 cgroup) exits only when the kernel lets it go, which
// may be never. Past this bound the tree counts such processes as stopped
// (UnkilledRunning counts them until they exit), so that no call and no
// turn waits on the kernel for ever. A thousand trees killed at once on a
// loaded two-CPU machine are gone in about two seconds.
var unkillableAfter = 5 * time.Second

var unkilledRunning atomic.Int64

// UnkilledRunning returns the number of processes of stopped trees that
// were sent SIGKILL and had not exited unkillableAfter (5s) later, and
// have not exited since: processes in uninterruptible sleep. They run no
// code of their own any more; each is counted until it exits.
func UnkilledRunning() int64 { return unkilledRunning.Load() }

// Start starts cmd, which must not have been started, as the root of a new
// tree owned with strategy s (see Resolve; Auto picks). It sets
// cmd.SysProcAttr (a copy of the caller's, with Setsid: a session and
// process group of its own, without a terminal; Pdeathsig SIGKILL unless
// the caller set another; and the cgroup to start in) and cmd.Env (the marker TIMEBOX_CALL is added; a nil Env
// becomes this process's environment first, as exec.Cmd would have used).
//
// The root gets SIGKILL if this process dies without stopping it (killed
// with SIGKILL, crashed); what the root started is stopped by the next
// timebox process on the machine (ReapOrphans).
//
// If ctx is done before the process is started — checked right before the
// fork, after any wait for the call's cgroup or for other starts — nothing
// is started and the error wraps ErrNotStarted and context.Cause(ctx).
// ctx has no effect once the process runs: stopping it is Stop's work.
//
// The caller must call Wait once the tree is done with, whatever happened:
// it reaps the root and releases the tree's cgroup. It returns cmd.Start's
// error, or an error from Resolve or from making the call's cgroup.
func Start(ctx context.Context, cmd *exec.Cmd, s Strategy) (*Tree, error) {
	st, err := Resolve(s)
	if err != nil {
		return nil, err
	}
	reapAtFirstStart()
	if ctx.Err() != nil {
		return nil, notStarted(ctx)
	}
	n := calls.Add(1)
	t := &Tree{cmd: cmd, strategy: st, n: n, marker: markerValue(n),
		exited: make(chan struct{}), members: map[int]*handle{}}
	attr := &syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		cp := *cmd.SysProcAttr
		attr = &cp
	}
	// A session of its own, so a process group of its own too: the
	// tracking strategy signals it, and a terminal's Ctrl-C reaches
	// timebox, not its tools. A session, not only a group: in timebox's
	// session a tool could open /dev/tty, type into the shell that started
	// timebox (TIOCSTI), answer its approval prompt, or take the
	// terminal's foreground and stop timebox with SIGTTIN; and a process
	// could join another call's group. A new session has no terminal.
	attr.Setsid, attr.Setpgid, attr.Pgid = true, false, 0
	dieWithParent(attr)
	cmd.Env = withMarker(cmd.Env, t.marker)
	if st == Cgroup {
		cg, err := newCallCgroup(ctx, n, attr)
		if errors.Is(err, ErrNotStarted) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("making the call's cgroup: %w", err)
		}
		t.cg = cg
	}
	cmd.SysProcAttr = attr
	if err := starts.start(ctx, cmd); err != nil {
		if t.cg != nil {
			t.cg.release()
		}
		return nil, err
	}
	t.pid = cmd.Process.Pid
	if st == Track {
		trk.add(n, t.pid)
	}
	root, err := openHandle(t.pid)
	if err != nil {
		root = &handle{pid: t.pid}
	}
	go t.watchRoot(root)
	return t, nil
}

// watchRoot closes exited when the root process exits, without reaping it:
// while the root is an unreaped zombie its pid, which is also the process
// group's id, cannot be reused, so signalling the group stays safe until
// Wait reaps it.
func (t *Tree) watchRoot(h *handle) {
	defer close(t.exited)
	defer h.close()
	if h.f != nil && h.wait(time.Time{}) {
		return
	}
	waitExit(t.pid)
}

// Strategy returns the strategy that owns the tree: Cgroup or Track.
func (t *Tree) Strategy() Strategy { return t.strategy }

// Marker returns the TIMEBOX_CALL value the tree's processes carry.
func (t *Tree) Marker() string { return t.marker }

// PID returns the root process's pid.
func (t *Tree) PID() int { return t.pid }

// Exited returns a channel that is closed when the root process has exited
// (other processes of the tree may still be running).
func (t *Tree) Exited() <-chan struct{} { return t.exited }

// Stop stops the tree: SIGTERM to every process of it, then, after grace
// or as soon as they have all exited, SIGKILL to whatever is left. It
// returns when no process of the tree is alive (zombies count as gone).
// With a grace of zero or less it sends SIGKILL at once. Stop after Wait
// does nothing.
func (t *Tree) Stop(grace time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waited || t.gone || t.unkilled != nil {
		return
	}
	if grace > 0 {
		deadline := time.Now().Add(grace)
		t.signal(unix.SIGTERM)
		if t.cg != nil {
			if t.waitCgroupGone(deadline, unix.SIGTERM) && waitAll(t.sweepEscapees(unix.SIGTERM), deadline) {
				return
			}
		} else if t.waitGone(deadline, unix.SIGTERM) {
			return
		}
	}
	t.kill()
	if t.cg != nil && t.unkilled == nil {
		// Whatever of the call left its cgroup (a privileged process
		// can) is stopped with it, before the stop returns.
		t.killEscapees()
	}
}

// Wait kills whatever is left of the tree (SIGKILL), waits until no
// process of it is alive, reaps the root and releases the tree's cgroup.
// It returns the root's exit as cmd.Wait does (nil, *exec.ExitError, ...).
// Calls after the first return the same.
//
// A process that has not exited unkillableAfter (5s) after it was sent
// SIGKILL is not waited for (Unkilled lists it): the root is reaped and
// the cgroup released in the background once it exits, and if it is the
// root, Wait returns an error saying so.
func (t *Tree) Wait() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waited {
		return t.err
	}
	t.waited = true
	if !t.gone && t.unkilled == nil && t.live() {
		t.kill()
	}
	if t.cg != nil && !t.swept {
		// The cgroup is empty; whatever of the call left it may not be.
		// A call that ended on its own does not wait for the look
		// (sweeper).
		sweeps.add(t.n)
	}
	if !closed(t.exited) {
		// Still alive after the whole tree was killed: the root left the
		// tree (a privileged process can move itself out of its cgroup),
		// or it is one of the unkilled. It is our child, so its pid is
		// ours to signal until reaped.
		unix.Kill(t.pid, unix.SIGKILL)
		wait := time.NewTimer(unkillableAfter)
		select {
		case <-t.exited:
		case <-wait.C:
		}
		wait.Stop()
	}
	rootExited := closed(t.exited)
	if !rootExited && !slices.Contains(t.unkilled, t.pid) {
		t.unkilled = append(t.unkilled, t.pid)
	}
	members := t.members
	t.members = nil
	if len(t.unkilled) == 0 {
		t.err = t.cmd.Wait()
		t.finish(members)
		return t.err
	}
	unkilledRunning.Add(int64(len(t.unkilled)))
	if rootExited {
		t.err = t.cmd.Wait()
	} else {
		t.err = fmt.Errorf("process %d did not exit within %s of SIGKILL (it is in uninterruptible sleep; it will exit when the kernel lets it go)",
			t.pid, unkillableAfter)
	}
	go func() {
		for _, h := range members {
			h.wait(time.Time{})
		}
		if !rootExited {
			<-t.exited
			t.cmd.Wait()
		}
		if t.cg != nil {
			// The last member has exited; the kernel's count follows.
			pollUntil(time.Now().Add(time.Second), func() bool { return !t.cg.populated() })
		}
		t.finish(members)
		unkilledRunning.Add(-int64(len(t.unkilled)))
	}()
	return t.err
}

// Unkilled returns the pids of the processes of the tree that were still
// alive unkillableAfter (5s) after they were sent SIGKILL, when Stop or
// Wait gave up waiting for them; nil when every process exited.
func (t *Tree) Unkilled() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.unkilled)
}

// finish closes the handles of a tree whose root was reaped, releases its
// cgroup and its hold on the starter's thread.
func (t *Tree) finish(members map[int]*handle) {
	forgetOwn(t.pid) // reaped
	for _, h := range members {
		h.close()
	}
	if t.cg != nil {
		t.cg.release()
	} else {
		trk.remove(t.pid)
	}
	starts.release()
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// live reports whether any process of the tree is alive, cheaply for a
// cgroup (one read of cgroup.events) and with a shared scan for tracking.
func (t *Tree) live() bool {
	if t.cg != nil && !t.cg.populated() {
		t.gone = true
		return false
	}
	return t.refresh(0) > 0
}

// signal sends sig to every process of the tree.
//
// The root's process group first, in one system call, so that the common
// case (nothing left the group) is signalled before any scan: under a
// burst of stops the trees start exiting at once instead of each after its
// own scan. The root is not reaped before Wait, so the group's id is still
// its own. Then whatever left the group or joined it too late is found and
// signalled on its own.
func (t *Tree) signal(sig unix.Signal) {
	if t.cg != nil {
		t.signalCgroup(sig)
		return
	}
	before := bootTicks()
	if unix.Kill(-t.pid, sig) == nil {
		t.refreshGroup(sig, before)
		return
	}
	t.refresh(sig)
}

// signalCgroup signals a cgroup's tree. The processes in the cgroup just
// before the group signal that are in the root's group after it had it;
// the others — outside the group, or new — are held and signalled on
// their own, once each. A process in the group is not held: the tree waits
// for the cgroup to empty (cgroup.events), not for each process, so the
// common case costs two reads of cgroup.procs, a getpgid per process and
// no pidfd.
func (t *Tree) signalCgroup(sig unix.Signal) {
	pre := t.cg.procs()
	if unix.Kill(-t.pid, sig) != nil {
		pre = nil // no such group left: every process on its own
	}
	if t.signalled == nil {
		t.signalled = map[int]bool{}
	}
	for _, pid := range pre {
		if pgid, err := unix.Getpgid(pid); err == nil && pgid == t.pid {
			t.signalled[pid] = true
		}
	}
	t.signalNew(sig)
}

// signalNew sends sig to the processes in the tree's cgroup that have not
// had it: each held by a pidfd, so that the signal reaches that process
// and not one that was given its pid since cgroup.procs was read.
func (t *Tree) signalNew(sig unix.Signal) {
	for _, pid := range t.cg.procs() {
		if t.signalled[pid] {
			continue
		}
		t.holdCgroupMember(pid)
		if h, ok := t.members[pid]; ok {
			h.signal(sig)
			t.signalled[pid] = true
		}
	}
}

// waitCgroupGone waits until the tree's cgroup is empty, or until the
// deadline, and reports whether it is. The kernel wakes it when the
// cgroup empties (cgroup.events is pollable), so it neither polls nor
// holds a process. Every so often (10ms, doubling up to 250ms) it looks for
// processes started since the tree was signalled and sends them sig (when
// not zero): a process forked just after the signal did not get it, and a
// parent that waits for it (a shell's trap running `wait`) would otherwise
// hold the whole tree until SIGKILL.
func (t *Tree) waitCgroupGone(deadline time.Time, sig unix.Signal) bool {
	rescan := 10 * time.Millisecond
	for {
		until := time.Now().Add(rescan)
		if deadline.Before(until) {
			until = deadline
		}
		if t.cg.waitEmpty(until) {
			t.gone = true
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		if sig != 0 {
			t.signalNew(sig)
		}
		rescan = min(2*rescan, 250*time.Millisecond)
	}
}

// refreshGroup holds the members a scan finds right after the process
// group was sent sig (at boot tick `before` or later). A member that
// existed when the group was signalled got it then, and is counted as
// signalled, so that a process that traps the signal sees it once: one
// held before, or one that started a whole clock tick before the group
// was signalled. Every other member gets it now — among them a process
// forked between the group signal and the scan, which the group signal
// missed (a parent that forks as it handles SIGTERM). One that started in
// the same clock tick as the group signal may see it twice; missing it
// would cost its whole kill grace.
func (t *Tree) refreshGroup(sig unix.Signal, before uint64) {
	for _, ref := range trk.members(t.n) {
		old, known := t.members[ref.pid]
		known = known && !old.exited()
		h := t.hold(ref)
		if ref.inGroup && (known || startedBefore(ref.pid, before)) {
			if h.sent == nil {
				h.sent = map[unix.Signal]bool{}
			}
			h.sent[sig] = true
		} else {
			h.signal(sig)
		}
	}
}

// refresh lists the tree's processes, holds those not held yet, sends sig
// (if not zero) to every held one that has not had it, and returns how many
// are alive.
func (t *Tree) refresh(sig unix.Signal) int {
	if t.cg != nil {
		for _, pid := range t.cg.procs() {
			t.holdCgroupMember(pid)
		}
	} else {
		for _, ref := range trk.members(t.n) {
			t.hold(ref)
		}
	}
	alive := 0
	for _, h := range t.members {
		if sig != 0 {
			h.signal(sig)
		}
		if !h.exited() {
			alive++
		}
	}
	return alive
}

// hold keeps the handle of a process a scan found, unless one is held
// already, and returns it.
func (t *Tree) hold(ref procRef) *handle {
	if h, ok := t.members[ref.pid]; ok && !h.exited() {
		closeFD(ref.fd)
		return h
	}
	h := newHandle(ref.pid, ref.fd)
	if old, ok := t.members[ref.pid]; ok {
		old.close()
	}
	t.members[ref.pid] = h
	return h
}

func (t *Tree) holdCgroupMember(pid int) {
	if h, ok := t.members[pid]; ok && !h.exited() {
		return
	}
	h, err := openHandle(pid)
	if err != nil {
		return
	}
	// The root is our child and not reaped until Wait, so its pid names
	// it: only another pid may have been reused since cgroup.procs was
	// read.
	if pid != t.pid && !t.cg.has(pid) {
		h.close()
		return
	}
	if old, ok := t.members[pid]; ok {
		old.close()
	}
	t.members[pid] = h
}

// waitGone waits until no process of the tree is alive, or until the
// deadline (zero: no deadline), and reports whether none is. It looks for
// new processes every so often (10ms, doubling up to 250ms) and sends them
// sig too: a process forked just after the tree was signalled did not get
// the signal, and a parent that waits for it (a shell's trap running
// `wait`) would otherwise hold the whole tree until SIGKILL.
func (t *Tree) waitGone(deadline time.Time, sig unix.Signal) bool {
	rescan := 10 * time.Millisecond
	for {
		until := time.Now().Add(rescan)
		if !deadline.IsZero() && deadline.Before(until) {
			until = deadline
		}
		exited := true
		for _, h := range t.members {
			if !h.wait(until) {
				exited = false
				break
			}
		}
		if !exited {
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				return false
			}
			t.refresh(sig)
			rescan = min(2*rescan, 250*time.Millisecond)
			continue
		}
		// Every process held has exited; look for any started meanwhile.
		if t.cg != nil && !t.cg.populated() {
			t.gone = true
			return true
		}
		if t.refresh(sig) == 0 {
			if t.cg == nil {
				t.gone = true
				return true
			}
			// The cgroup is populated but nothing in it could be held:
			// its last process is between exiting and leaving it. The
			// kernel's own count is the truth; look again shortly.
			time.Sleep(time.Millisecond)
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return false
		}
	}
}

// sweepEscapees looks, once a cgroup's tree has emptied its cgroup (or
// been sent sig), for processes of the call outside the cgroup: a process
// that may write to another cgroup's cgroup.procs (root, or the owner of a
// delegated subtree, where no cgroup namespace with nsdelegate stops it)
// can leave its call's cgroup, but it keeps the marker it inherited. Each
// one found is held, recorded in t.escapees and sent sig; they are
// returned for the caller to wait for. One scan of /proc, shared with
// every other tree looking at the same time.
func (t *Tree) sweepEscapees(sig unix.Signal) []*handle {
	t.swept = true
	var found []*handle
	for _, ref := range trk.members(t.n) {
		if t.cg.has(ref.pid) {
			closeFD(ref.fd) // inside: the cgroup's own stop reaches it
			continue
		}
		h := t.hold(ref)
		if h.exited() {
			continue // a zombie: nothing left to stop
		}
		if !slices.Contains(t.escapees, ref.pid) {
			t.escapees = append(t.escapees, ref.pid)
			escapedTotal.Add(1)
		}
		h.signal(sig)
		found = append(found, h)
	}
	return found
}

// killEscapees sends SIGKILL to the processes of the call outside its
// cgroup and waits for them as kill does for the cgroup.
func (t *Tree) killEscapees() {
	esc := t.sweepEscapees(unix.SIGKILL)
	if waitAll(esc, time.Now().Add(unkillableAfter)) {
		return
	}
	for _, h := range esc {
		if !h.exited() && !slices.Contains(t.unkilled, h.pid) {
			t.unkilled = append(t.unkilled, h.pid)
		}
	}
	slices.Sort(t.unkilled)
}

// waitAll waits until every process of hs has exited, or until the
// deadline, and reports whether they all have.
func waitAll(hs []*handle, deadline time.Time) bool {
	for _, h := range hs {
		if !h.wait(deadline) {
			return false
		}
	}
	return true
}

// Escaped returns the pids of the processes of the call that were found
// outside its cgroup, and stopped there (Cgroup strategy); nil when none
// left it.
func (t *Tree) Escaped() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.escapees)
}

// kill sends SIGKILL to every process of the tree and waits until none is
// alive, or until unkillableAfter has passed (see there), when it records
// in t.unkilled the processes still alive.
func (t *Tree) kill() {
	if t.cg != nil {
		// cgroup.kill reaches every process at once, including one in the
		// middle of a fork, so what is left is to wait for the cgroup to
		// empty; without it (Linux < 5.14) waitGone sends SIGKILL to each
		// process it finds until none is left.
		if t.cg.kill() == nil {
			if t.waitCgroupGone(time.Now().Add(unkillableAfter), 0) {
				return
			}
			t.unkilled = t.cg.procs()
			slices.Sort(t.unkilled)
			return
		}
	} else {
		unix.Kill(-t.pid, unix.SIGKILL)
	}
	for _, h := range t.members {
		h.signal(unix.SIGKILL)
	}
	if t.waitGone(time.Now().Add(unkillableAfter), unix.SIGKILL) {
		return
	}
	t.unkilled = []int{}
	for pid, h := range t.members {
		if !h.exited() {
			t.unkilled = append(t.unkilled, pid)
		}
	}
	slices.Sort(t.unkilled)
}
