//go:build linux || darwin

package proctree

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// parentPrefix starts the name of this process's cgroup directory,
// timebox-<instance>. Before instances named their owner it was
// timebox-<pid>.
const parentPrefix = "timebox-"

// ownInstance returns "<pid>.<start>.<pidns>" for this process (see
// Instance), and false when its start time or pid namespace cannot be read.
func ownInstance() (string, bool) {
	st, err := readStat(os.Getpid())
	ns, nerr := pidNamespace()
	if err != nil || nerr != nil || st.start == 0 {
		return "", false
	}
	return fmt.Sprintf("%d.%d.%d", os.Getpid(), st.start, ns), true
}

// owner is the timebox process an instance names.
type owner struct {
	pid   int
	start uint64 // clock ticks after boot
	ns    uint64 // pid namespace inode
}

// parseOwner parses an instance "<pid>.<start>.<pidns>". Instances of
// another form (random ones, those of older timebox versions) name no
// owner, and their processes are never reaped.
func parseOwner(inst string) (owner, bool) {
	f := strings.Split(inst, ".")
	if len(f) != 3 {
		return owner{}, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	ns, err3 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || pid <= 0 {
		return owner{}, false
	}
	return owner{pid: pid, start: start, ns: ns}, true
}

// gone reports whether the owner has provably exited: it lived in this
// pid namespace, and no process with its pid exists now, or the one that
// does started at another time (the pid was reused), or it is a zombie.
// Anything that cannot be told (another namespace, a /proc that hides the
// process) counts as alive: a live timebox's processes must never be
// touched.
func (o owner) gone() bool {
	ns, err := pidNamespace()
	if err != nil || ns != o.ns {
		return false
	}
	if unix.Kill(o.pid, 0) == unix.ESRCH {
		return true
	}
	st, err := readStat(o.pid)
	if err != nil {
		return false
	}
	return st.start != o.start || st.gone()
}

var (
	reapMu      sync.Mutex
	reapedTotal atomic.Int64
	reapOnce    sync.Once
)

// ReapedTotal returns the number of processes ReapOrphans has killed in
// this process, whoever called it.
func ReapedTotal() int64 { return reapedTotal.Load() }

// reapAtFirstStart runs ReapOrphans once per process, at the first Start,
// unless the program called it already (the CLI does, at its start, so
// that it can say what it did).
func reapAtFirstStart() {
	reapOnce.Do(func() { reapOrphans() })
}

// ReapOrphans stops what timebox processes that no longer exist left
// running: the processes of calls that were under way when their timebox
// was killed with SIGKILL or crashed, and so could not stop them. A
// tree's root dies with its timebox (Pdeathsig); its descendants do not.
// ReapOrphans finds them two ways, whatever strategy the dead process used:
//
//   - its stale cgroups (timebox-<instance> under this process's own
//     cgroup): every process in them is killed with cgroup.kill, then the
//     directories are removed;
//   - every process whose TIMEBOX_CALL marker names, as the call that
//     started it (the first element), an instance whose owner is gone
//     (see Instance): it is killed with SIGKILL through a pidfd opened
//     before its marker was read.
//
// An instance whose owner is alive, or cannot be proven gone (another pid
// namespace, a random instance), is never touched; nor is a cgroup of the
// old form (timebox-<pid>) that still holds processes. ReapOrphans waits
// up to 5s for the killed processes to exit. It runs at the first Start of
// a process anyway; a program calls it at its start to reap at once and
// to report what it did. Safe for concurrent use; calls run one at a time.
func ReapOrphans() (Reaped, error) {
	reapOnce.Do(func() {})
	return reapOrphans()
}

func reapOrphans() (Reaped, error) {
	defer lockReaping()()
	return reapLocked()
}

// lockReaping takes the right to reap, in this process (reapMu) and among
// the timebox processes of this user on the machine (a lock file in the
// temporary directory): two that start at once would otherwise kill the
// same orphans and both count them. Without the lock file (a read-only
// temporary directory) reaping goes on unserialised: killing twice is
// harmless, only the counts may overlap. It returns the unlock.
func lockReaping() (unlock func()) {
	reapMu.Lock()
	name := filepath.Join(os.TempDir(), fmt.Sprintf("timebox-reap-%d.lock", os.Getuid()))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return reapMu.Unlock
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	return func() {
		f.Close() // releases the flock
		reapMu.Unlock()
	}
}

// reapLocked is ReapOrphans under lockReaping.
func reapLocked() (Reaped, error) {
	var r Reaped
	owners := map[int]bool{}
	var errs []error
	if h, err := cgHost(); err == nil {
		n, dirs, who, unkilled, err := h.reapStale() // Linux
		r.Processes += n
		r.Cgroups += dirs
		r.Unkilled += unkilled
		for _, pid := range who {
			owners[pid] = true
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	killed, who := reapMarked()
	for pid := range who {
		owners[pid] = true
	}
	deadline := time.Now().Add(unkillableAfter)
	for _, h := range killed {
		if !h.wait(deadline) {
			r.Unkilled++
		}
		h.close()
	}
	r.Processes += len(killed)
	for pid := range owners {
		r.Owners = append(r.Owners, pid)
	}
	slices.Sort(r.Owners)
	reapedTotal.Add(int64(r.Processes))
	return r, errors.Join(errs...)
}

// reapMarked sends SIGKILL to every live process whose marker's own call
// (the first element) belongs to a gone owner, and returns them, held by
// pidfds, with their owners' pids. It looks again while it finds some: a
// process may have forked in between.
func reapMarked() ([]*handle, map[int]bool) {
	var killed []*handle
	owners := map[int]bool{}
	gone := map[string]bool{} // instance → owner gone, once looked up
	isGone := func(inst string) (owner, bool) {
		o, ok := parseOwner(inst)
		if !ok || inst == Instance() {
			return o, false
		}
		g, seen := gone[inst]
		if !seen {
			g = o.gone()
			gone[inst] = g
		}
		return o, g
	}
	self := os.Getpid()
	done := map[int]bool{}
	buf := make([]byte, 0, 4096)
	for range 10 {
		all, err := pids()
		if err != nil {
			break
		}
		found := 0
		for _, pid := range all {
			if pid == self || done[pid] {
				continue
			}
			st, err := readStat(pid)
			if err != nil || st.gone() {
				continue
			}
			// The pidfd is opened before the environment is read, so
			// that the signal reaches the process that was read.
			fd, err := openPidfd(pid)
			if err == unix.ESRCH {
				continue
			}
			var v string
			var marked bool
			v, marked, buf = readMarker(pid, buf)
			own, _, _ := strings.Cut(v, ",")
			i := strings.LastIndexByte(own, '-')
			if !marked || i < 0 {
				closeFD(fd)
				continue
			}
			o, g := isGone(own[:i])
			if !g {
				closeFD(fd)
				continue
			}
			h := newHandle(pid, fd)
			if h.signal(unix.SIGKILL) != nil {
				h.close()
				continue
			}
			done[pid] = true
			owners[o.pid] = true
			killed = append(killed, h)
			found++
		}
		if found == 0 {
			break
		}
	}
	return killed, owners
}
