package proctree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupHost is where this process makes its calls' cgroups: directories
// under timebox-<instance>, itself under this process's own cgroup v2
// directory. The instance names this process (pid, start time, pid
// namespace), so that the next timebox process can tell when it is gone
// and stop what it left (ReapOrphans).
//
// A call's cgroup is reused by a later call once it is empty: making and
// removing two cgroup directories per call (the parent and the call's)
// would cost more than a tenth of a small tool's whole run. The pool keeps
// as many as the most calls that ran at once lately (in this idle-linger
// window or the last one), so that a burst of a thousand calls finds a
// thousand cgroups the next time without keeping them for ever. The idle
// ones, and the parent, are removed when no call has run for idleLinger,
// or at once by Close; a process that exits sooner leaves them, and the
// next timebox process on the machine removes them.
type cgroupHost struct {
	base      string // this process's own cgroup directory
	rel       string // the same as /proc/<pid>/cgroup names it ("/..." )
	parent    string // base/timebox-<instance>
	parentRel string

	// mu guards the fields below. It is never held while a directory is
	// made or opened: the kernel serialises cgroup creation, and under a
	// burst a call would otherwise wait here for everyone's mkdir.
	mu     sync.Mutex
	made   bool          // the parent may exist
	active int           // calls holding a cgroup, or making one
	idle   []*callCgroup // empty cgroups ready for reuse
	linger *time.Timer   // removes the idle cgroups and the parent
	// peak is the most calls active at once in the current window of
	// idleLinger, which started at window; lastPeak that of the window
	// before. The pool keeps up to the larger of the two.
	peak, lastPeak int
	window         time.Time

	making chan struct{} // a token per cgroup being made (see makers)

	// ownNS is set when a call's root can be given a cgroup namespace of
	// its own, rooted at its call's cgroup (CLONE_NEWCGROUP, which needs
	// CAP_SYS_ADMIN): where the cgroup2 file system is mounted with
	// nsdelegate (systemd's default), the kernel then refuses to move a
	// process of the call to a cgroup outside it, even for root.
	ownNS bool
}

// newCallCgroup returns the cgroup of call n and sets attr so that the
// call's root is started in it (clone3 with CLONE_INTO_CGROUP), in a
// cgroup namespace of its own where it may have one: it sees itself at
// "/", and with nsdelegate it cannot move itself or its children out
// (docs/decisions/tool-isolation.md).
func newCallCgroup(ctx context.Context, n uint64, attr *syscall.SysProcAttr) (*callCgroup, error) {
	host, err := cgHost()
	if err != nil {
		return nil, err
	}
	cg, err := host.newCall(ctx, n)
	if err != nil {
		return nil, err
	}
	attr.UseCgroupFD, attr.CgroupFD = true, cg.fd
	if host.ownNS {
		attr.Unshareflags |= unix.CLONE_NEWCGROUP
	}
	return cg, nil
}

// idleLinger is how long idle call cgroups and their parent are kept after
// the last call ends, and the window over which the pool's size is the
// peak number of calls at once.
const idleLinger = 2 * time.Second

// cgHost finds and probes the cgroup v2 hierarchy once per process.
var cgHost = sync.OnceValues(detectCgroup)

// cgroupUsable returns nil when calls can run in cgroups here, else why not.
func cgroupUsable() error {
	_, err := cgHost()
	return err
}

func detectCgroup() (*cgroupHost, error) {
	own, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	mounts, err := cgroup2Mounts()
	if err != nil {
		return nil, err
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup2 file system is mounted")
	}
	var base string
	for _, m := range mounts {
		rel, ok := within(own, m.root)
		if !ok {
			continue
		}
		dir := filepath.Join(m.point, rel)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			base = dir
			break
		}
	}
	if base == "" {
		return nil, fmt.Errorf("this process's cgroup %s is not under any cgroup2 mount", own)
	}
	name := parentPrefix + Instance()
	h := &cgroupHost{base: base, rel: own, parent: filepath.Join(base, name), parentRel: path.Join(own, name),
		making: make(chan struct{}, makers)}
	if err := h.probe(); err != nil {
		return nil, err
	}
	return h, nil
}

// probe makes a call cgroup and starts a process inside it that fails to
// exec a path that does not exist. ENOENT means the child was created in
// the cgroup (clone3 with CLONE_INTO_CGROUP worked) and only its exec
// failed; anything else (EACCES, EPERM, ENOSYS under an old seccomp
// profile, EBUSY) means children cannot be started in our cgroups, and we
// learn it now rather than on a tool call.
func (h *cgroupHost) probe() error {
	c, err := h.newCall(context.Background(), 0)
	if err != nil {
		return err
	}
	defer c.discard()
	_, err = os.StartProcess("/nonexistent/timebox-cgroup-probe", []string{"timebox-cgroup-probe"},
		&os.ProcAttr{Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: c.fd}})
	if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cannot start a process inside a cgroup under %s: %v", h.base, err)
	}
	// The same with a cgroup namespace of its own: EPERM without the
	// privilege, ENOENT when it can be had.
	_, err = os.StartProcess("/nonexistent/timebox-cgroup-probe", []string{"timebox-cgroup-probe"},
		&os.ProcAttr{Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: c.fd, Unshareflags: unix.CLONE_NEWCGROUP}})
	h.ownNS = errors.Is(err, unix.ENOENT)
	return nil
}

// nsDelegate reports whether the cgroup2 file system holding base is
// mounted with nsdelegate: a cgroup namespace is then a boundary no
// process inside it can move a process across.
func nsDelegate(base string) bool {
	mounts, err := cgroup2Mounts()
	if err != nil {
		return false
	}
	for _, m := range mounts {
		if (base == m.point || strings.HasPrefix(base, m.point+"/")) && slices.Contains(m.options, "nsdelegate") {
			return true
		}
	}
	return false
}

// callCgroup is the cgroup of one call.
type callCgroup struct {
	host *cgroupHost
	dir  string
	rel  string // as /proc/<pid>/cgroup names it
	fd   int    // the directory, open for clone3
	// events, procsFD and stat are its cgroup.events, cgroup.procs and
	// cgroup.stat, kept open with the directory while the cgroup is in
	// the pool: reading one is then one pread, where opening it by path
	// costs an open (the kernel's walk of the path), a read and a close,
	// three times a call. -1 when not open (a stale cgroup found on disk
	// is read by path).
	events, procsFD, stat int
	// eventsFile is events in Go's poller, for waitEmpty; nil when events
	// is not open.
	eventsFile *os.File
	eventsConn syscall.RawConn
	// killed is set once cgroup.kill was written: some kernels keep killing
	// every process that later enters the cgroup, so it is not reused.
	killed bool
}

// makers bounds how many call cgroups are being made at once. The kernel
// makes them one at a time (under its cgroup mutex) and each takes a few
// milliseconds on a loaded machine; a burst of a thousand calls waits for
// its turn here, where the wait ends with ctx, rather than in mkdir, where
// it cannot.
const makers = 4

// newCall returns an empty cgroup for call n: an idle one, or a new
// directory named after the call. If it has to make one and ctx is done
// while it waits for its turn, it returns an error wrapping ErrNotStarted.
func (h *cgroupHost) newCall(ctx context.Context, n uint64) (*callCgroup, error) {
	h.mu.Lock()
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	h.active++
	h.notePeakLocked(time.Now())
	if k := len(h.idle); k > 0 {
		c := h.idle[k-1]
		h.idle = h.idle[:k-1]
		h.mu.Unlock()
		return c, nil
	}
	// While this call is active no sweep removes the parent, so it can be
	// made, and the call's directory in it, without the lock.
	h.made = true
	h.mu.Unlock()

	select {
	case h.making <- struct{}{}:
	case <-ctx.Done():
		h.mu.Lock()
		h.active--
		h.idleLocked()
		h.mu.Unlock()
		return nil, notStarted(ctx)
	}
	defer func() { <-h.making }()
	name := "call-" + strconv.FormatUint(n, 10)
	c := &callCgroup{host: h, dir: filepath.Join(h.parent, name), rel: path.Join(h.parentRel, name), fd: -1,
		events: -1, procsFD: -1, stat: -1}
	err := os.Mkdir(c.dir, 0o755)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.Mkdir(h.parent, 0o755); err == nil || errors.Is(err, os.ErrExist) {
			err = os.Mkdir(c.dir, 0o755)
		}
	}
	if err == nil {
		c.fd, err = unix.Open(c.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = c.openFiles()
		}
		if err != nil {
			c.closeFD()
			unix.Rmdir(c.dir)
		}
	}
	if err != nil {
		h.mu.Lock()
		h.active--
		h.idleLocked()
		h.mu.Unlock()
		return nil, err
	}
	return c, nil
}

// notePeakLocked records the number of active calls in the peak of the
// current window, starting a new window when idleLinger has passed.
func (h *cgroupHost) notePeakLocked(now time.Time) {
	if now.Sub(h.window) >= idleLinger {
		h.lastPeak, h.peak, h.window = h.peak, 0, now
	}
	h.peak = max(h.peak, h.active)
}

// poolSizeLocked is how many cgroups, active and idle, the pool keeps.
func (h *cgroupHost) poolSizeLocked() int { return max(h.peak, h.lastPeak) }

// release gives back the cgroup of a call whose tree is gone: to the idle
// list when it is empty, has no cgroups below it and the pool is not full,
// else it is removed. Idle cgroups beyond the pool's size (after a burst)
// are removed too.
func (c *callCgroup) release() {
	h := c.host
	if c.killed || c.populated() || c.hasDescendants() {
		c.closeFD()
		pollUntil(time.Now().Add(time.Second), func() bool { return removeTree(c.dir) })
		c = nil
	}
	h.mu.Lock()
	h.active--
	h.notePeakLocked(time.Now())
	if c != nil {
		h.idle = append(h.idle, c)
	}
	var drop []*callCgroup
	if keep := max(h.poolSizeLocked()-h.active, 0); len(h.idle) > keep {
		drop = slices.Clone(h.idle[keep:])
		h.idle = h.idle[:keep]
	}
	h.idleLocked()
	h.mu.Unlock()
	for _, d := range drop {
		d.closeFD()
		unix.Rmdir(d.dir)
	}
}

// discard removes a cgroup that was never used for a call (the probe's),
// and the parent with it when no call is active, so that a process that
// only checks its configuration leaves nothing behind.
func (c *callCgroup) discard() {
	c.closeFD()
	unix.Rmdir(c.dir)
	h := c.host
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active--
	if h.active == 0 {
		h.sweepLocked()
	}
}

// idleLocked arms the removal of the idle cgroups once no call is active.
func (h *cgroupHost) idleLocked() {
	if h.active > 0 || h.linger != nil || !h.made {
		return
	}
	h.linger = time.AfterFunc(idleLinger, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.linger = nil
		if h.active == 0 {
			h.sweepLocked()
		}
	})
}

// sweepLocked removes the idle cgroups and the parent, which must have no
// active call. It runs under h.mu, so that no call can be making a
// directory in the parent meanwhile; it runs only when no call is active,
// so nobody waits for it.
func (h *cgroupHost) sweepLocked() {
	for _, c := range h.idle {
		c.closeFD()
		unix.Rmdir(c.dir)
	}
	h.idle = nil
	if h.made && unix.Rmdir(h.parent) == nil {
		h.made = false
	}
}

// Close removes this process's idle cgroup directories now, and their
// parent when no call is running, instead of after the idle linger
// (2s). Later calls make them again. It is meant for the end of a program
// (a CLI run, a test binary); without it, a program that exits within the
// linger leaves empty directories that the next timebox process removes.
// Close is idempotent and safe for concurrent use; it never fails a call.
func Close() {
	h, err := cgHost()
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	if h.active == 0 {
		h.sweepLocked()
		return
	}
	for _, c := range h.idle {
		c.closeFD()
		unix.Rmdir(c.dir)
	}
	h.idle = nil
}

// openFiles opens the cgroup's files that its calls read (see events).
func (c *callCgroup) openFiles() error {
	for _, f := range []struct {
		name string
		fd   *int
	}{{"cgroup.events", &c.events}, {"cgroup.procs", &c.procsFD}, {"cgroup.stat", &c.stat}} {
		fd, err := unix.Openat(c.fd, f.name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("opening %s/%s: %w", c.dir, f.name, err)
		}
		*f.fd = fd
	}
	// The kernel notifies a poller of cgroup.events when a value in it
	// changes (populated going to 0 among them).
	c.eventsFile = os.NewFile(uintptr(c.events), "cgroup.events")
	if rc, err := c.eventsFile.SyscallConn(); err == nil {
		c.eventsConn = rc
	}
	return nil
}

// waitEmpty waits until no process is in the cgroup or below it, or until
// the deadline, and reports whether it is empty. With events open it
// sleeps in Go's poller until the kernel says cgroup.events changed; else
// it reads the file every few milliseconds.
func (c *callCgroup) waitEmpty(deadline time.Time) bool {
	if c.eventsConn != nil && c.eventsFile.SetReadDeadline(deadline) == nil {
		err := c.eventsConn.Read(func(fd uintptr) bool { return !c.populated() })
		if err == nil {
			return true
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
	}
	return pollUntil(deadline, func() bool { return !c.populated() })
}

func (c *callCgroup) closeFD() {
	if c.eventsFile != nil {
		c.eventsFile.Close() // and events with it
		c.eventsFile, c.eventsConn, c.events = nil, nil, -1
	}
	for _, fd := range []*int{&c.fd, &c.events, &c.procsFD, &c.stat} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// read reads one of the cgroup's files into buf: from the kept
// descriptor fd when it is open, else by path.
func (c *callCgroup) read(fd int, name string, buf []byte) ([]byte, error) {
	if fd < 0 {
		return readFile(c.dir+"/"+name, buf)
	}
	return preadAll(fd, buf)
}

// hasDescendants reports whether a privileged tool made cgroups below the
// call's, from cgroup.stat.
func (c *callCgroup) hasDescendants() bool {
	b, err := c.read(c.stat, "cgroup.stat", make([]byte, 0, 128))
	if err != nil {
		return true
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("nr_descendants ")); ok {
			return len(v) == 0 || v[0] != '0'
		}
	}
	return true
}

// populated reports whether any process is in the cgroup or below it, from
// cgroup.events, which the kernel updates as the last process exits, before
// its parent can see the exit.
func (c *callCgroup) populated() bool {
	eventsReads.Add(1)
	b, err := c.read(c.events, "cgroup.events", make([]byte, 0, 64))
	if err != nil {
		return true // cannot tell: the callers then list the processes
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("populated ")); ok {
			return len(v) > 0 && v[0] != '0'
		}
	}
	return true
}

// eventsReads counts the reads of cgroup.events, for the test that a
// stop sleeps in the poller rather than polling.
var eventsReads atomic.Int64

// procs lists the processes in the cgroup and in any cgroup a privileged
// tool made below it (looked for only when cgroup.stat counts some).
func (c *callCgroup) procs() []int {
	var out []int
	var walk func(dir string, below bool)
	walk = func(dir string, below bool) {
		var b []byte
		var err error
		if dir == c.dir {
			b, err = c.read(c.procsFD, "cgroup.procs", make([]byte, 0, 256))
		} else {
			b, err = readFile(dir+"/cgroup.procs", make([]byte, 0, 256))
		}
		if err == nil {
			for f := range bytes.FieldsSeq(b) {
				if pid, err := strconv.Atoi(string(f)); err == nil {
					out = append(out, pid)
				}
			}
		}
		if !below {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() {
				walk(filepath.Join(dir, e.Name()), true)
			}
		}
	}
	walk(c.dir, c.hasDescendants())
	return out
}

// staleCgroup is a cgroup found on disk, read by path.
func staleCgroup(dir string) *callCgroup {
	return &callCgroup{dir: dir, fd: -1, events: -1, procsFD: -1, stat: -1}
}

// errNoKill means the kernel has no cgroup.kill (before Linux 5.14).
var errNoKill = errors.New("cgroup.kill is not available")

// kill sends SIGKILL to every process in the cgroup and below it at once,
// including processes in the middle of forking.
func (c *callCgroup) kill() error {
	c.killed = true
	err := os.WriteFile(c.dir+"/cgroup.kill", []byte("1"), 0)
	if errors.Is(err, os.ErrNotExist) {
		return errNoKill
	}
	return err
}

// has reports whether pid is in the cgroup or below it, from
// /proc/<pid>/cgroup. The callers hold a pidfd on pid when they ask, so
// the answer is about that process and not one that reused its pid.
func (c *callCgroup) has(pid int) bool {
	b, err := readFile("/proc/"+strconv.Itoa(pid)+"/cgroup", make([]byte, 0, 256))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "0::"); ok {
			return p == c.rel || strings.HasPrefix(p, c.rel+"/")
		}
	}
	return false
}

// removeTree removes dir and the cgroup directories below it, deepest
// first, and reports whether dir is gone.
func removeTree(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	err := unix.Rmdir(dir)
	return err == nil || err == unix.ENOENT
}

// ownCgroup returns this process's cgroup v2 path, from the "0::" line of
// /proc/self/cgroup.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return strings.TrimSuffix(p, " (deleted)"), nil
		}
	}
	return "", errors.New("this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)")
}

type mount struct {
	root, point string
	options     []string // the file system's (nsdelegate, ...)
}

// cgroup2Mounts returns the cgroup2 mounts from /proc/self/mountinfo, the
// usual places first: /sys/fs/cgroup (a pure v2 system), then
// /sys/fs/cgroup/unified (a hybrid one).
func cgroup2Mounts() ([]mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	for line := range strings.Lines(string(b)) {
		// 36 35 0:31 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 1 || qf[0] != "cgroup2" {
			continue
		}
		m := mount{root: unescapeMount(pf[3]), point: unescapeMount(pf[4])}
		if len(qf) >= 3 {
			m.options = strings.Split(qf[2], ",") // the super block's: nsdelegate is one
		}
		out = append(out, m)
	}
	rank := func(m mount) int {
		switch m.point {
		case "/sys/fs/cgroup":
			return 0
		case "/sys/fs/cgroup/unified":
			return 1
		}
		return 2
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && rank(out[j]) < rank(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// within returns p relative to a mount's root, if p is inside it.
func within(p, root string) (string, bool) {
	if root == "/" {
		return p, true
	}
	if p == root {
		return "/", true
	}
	if rest, ok := strings.CutPrefix(p, root+"/"); ok {
		return "/" + rest, true
	}
	return "", false
}

// CgroupMembers returns the processes still in the cgroups that the timebox
// process with pid owner made for its calls (timebox-<pid>.<start>.<ns>,
// beside this process's own, under the cgroup a process and the children
// it starts share), whether owner is alive or gone. It is for tests that
// check that a timebox process they started left nothing behind, even a
// process that cleared its marker from its environment. It returns nil
// when calls cannot run in cgroups here.
func CgroupMembers(owner int) ([]int, error) {
	h, err := cgHost()
	if err != nil {
		return nil, nil
	}
	entries, err := os.ReadDir(h.base)
	if err != nil {
		return nil, err
	}
	var out []int
	prefix := parentPrefix + strconv.Itoa(owner) + "."
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			// The parent holds no process itself; its calls are below it.
			out = append(out, staleCgroup(filepath.Join(h.base, e.Name())).procs()...)
		}
	}
	return out, nil
}
