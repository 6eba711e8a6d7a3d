package proctree

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

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
