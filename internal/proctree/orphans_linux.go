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

// pidNamespace returns the inode number of this process's pid namespace:
// two processes compare pids only when it is the same.
func pidNamespace() (uint64, error) {
	var s unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &s); err != nil {
		return 0, err
	}
	return s.Ino, nil
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
		n, dirs, who, unkilled, err := h.reapStale()
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

// reapStale kills the processes in the cgroups of gone timebox processes
// and removes those cgroups (and the empty ones of the old timebox-<pid>
// form whose pid no longer exists). It returns how many processes it
// killed, how many directories it removed, whose they were, and how many
// processes had not exited unkillableAfter later.
func (h *cgroupHost) reapStale() (procs, dirs int, owners []int, unkilled int, err error) {
	entries, err := os.ReadDir(h.base)
	if err != nil {
		return 0, 0, nil, 0, err
	}
	self := filepath.Base(h.parent)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), parentPrefix)
		if !ok || !e.IsDir() || e.Name() == self {
			continue
		}
		dir := filepath.Join(h.base, e.Name())
		o, named := parseOwner(rest)
		if !named {
			// The old form names a pid only; a pid in another pid
			// namespace sharing this cgroup cannot be told apart, so
			// only empty directories are removed, as before.
			pid, err := strconv.Atoi(rest)
			if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
				continue
			}
			calls, _ := os.ReadDir(dir)
			for _, c := range calls {
				if c.IsDir() {
					removeTree(filepath.Join(dir, c.Name()))
				}
			}
			if unix.Rmdir(dir) == nil {
				dirs++
			}
			continue
		}
		if !o.gone() {
			continue
		}
		stale := staleCgroup(dir)
		n := len(stale.procs())
		if n > 0 {
			if err := stale.kill(); err != nil {
				// No cgroup.kill (Linux < 5.14): each process, until none
				// is left.
				pollUntil(time.Now().Add(unkillableAfter), func() bool {
					left := stale.procs()
					for _, pid := range left {
						unix.Kill(pid, unix.SIGKILL)
					}
					return len(left) == 0
				})
			}
			owners = append(owners, o.pid)
		}
		procs += n
		if !pollUntil(time.Now().Add(unkillableAfter), func() bool { return !stale.populated() }) {
			unkilled += len(stale.procs())
			continue // removed by a later start, once they have exited
		}
		if pollUntil(time.Now().Add(time.Second), func() bool { return removeTree(dir) }) {
			dirs++
		}
	}
	return procs, dirs, owners, unkilled, nil
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
			fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
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
