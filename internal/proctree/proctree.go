// Package proctree owns the process tree of a subprocess call: the process
// timebox starts and every process that process starts, however it tries
// to leave (its own process group, its own session, a double fork whose
// middle process exited). Spec §3 asks that no descendant of a stopped tool
// survives; this package is how.
//
// On Linux two strategies do the owning (see docs/decisions/process-tree.md;
// macOS has only Track, Windows a Job Object per call: docs/platforms.md):
//
//   - Cgroup: each call runs in its own cgroup v2 directory, created under
//     a per-process parent (<own cgroup>/timebox-<instance>/call-<n>); the child
//     is started directly inside it (clone3 with CLONE_INTO_CGROUP), so
//     nothing it starts can be missed. Stopping reads cgroup.procs and
//     forcing writes cgroup.kill.
//   - Track: the fallback for machines without a writable cgroup v2. The
//     child leads a new process group; every process of the call inherits
//     the marker variable TIMEBOX_CALL; stopping signals the group and every
//     process whose environment carries the call's marker, found by
//     scanning /proc. Known limit: a process that clears its own
//     environment and also leaves the process group is not found.
//
// Both strategies set the marker, so a leak check (internal/proctest) works
// the same under either. Both start the root with a parent-death signal
// (SIGKILL), so that it dies with timebox, and ReapOrphans stops, at the
// next start, whatever else a timebox that died left running. Both put the child in a new process group, so a
// terminal's Ctrl-C reaches timebox alone, which then stops its tools the
// way the spec says.
package proctree

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EnvStrategy is the environment variable that forces a strategy: auto,
// cgroup, track or job. Any other non-empty value is an error (Check),
// and so is one this platform does not have.
const EnvStrategy = "TIMEBOX_PROCTREE"

// EnvMarker is the environment variable every process of a call inherits.
// Its value is "<instance>-<n>" (Instance, then the call's sequence
// number); when timebox itself runs inside another timebox's call, the
// inherited value follows after a comma, so the outer timebox still
// recognises the inner one's processes as part of its call.
const EnvMarker = "TIMEBOX_CALL"

// Strategy is how a process tree is owned.
type Strategy string

// The strategies. Auto picks, on Linux, Cgroup when a writable cgroup v2
// hierarchy lets this process start children inside a cgroup of its own
// making, and Track otherwise; on macOS, Track; on Windows, Job.
const (
	Auto   Strategy = "auto"
	Cgroup Strategy = "cgroup"
	Track  Strategy = "track"
	// Job is Windows': each tree in a Job Object that kills its processes
	// when it is closed.
	Job Strategy = "job"
)

// ParseStrategy parses a strategy name. The empty string is Auto. Any other
// unknown value is an error listing the valid ones.
func ParseStrategy(s string) (Strategy, error) {
	switch Strategy(s) {
	case "", Auto:
		return Auto, nil
	case Cgroup, Track, Job:
		return Strategy(s), nil
	}
	return "", fmt.Errorf("%q is not a process-tree strategy (use auto, cgroup, track or job)", s)
}

// Check checks v, a value of the TIMEBOX_PROCTREE variable: empty, auto,
// cgroup, track or job. It returns an error naming the variable for any
// other value, for a strategy this platform does not have, and for cgroup
// when no usable cgroup v2 hierarchy is found (with the reason), so that a
// configuration check reports it before anything runs (spec §10). It may
// create and remove a probe cgroup and start a probe process that fails to
// exec. Safe for concurrent use.
func Check(v string) error {
	if v == "" {
		return nil
	}
	s, err := ParseStrategy(v)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", EnvStrategy, v, err)
	}
	if s != Auto {
		if err := usable(s); err != nil {
			return fmt.Errorf("%s=%s: %w; use auto", EnvStrategy, s, err)
		}
	}
	return nil
}

// Resolve returns the concrete strategy (Cgroup, Track or Job) that Start
// uses for s. An explicit one wins when this platform has it; Auto (or "") defers to
// TIMEBOX_PROCTREE, and when that is unset or auto, to detection, which
// runs once per process. It returns an error for an invalid
// TIMEBOX_PROCTREE and for Cgroup when cgroups are not usable here. Safe
// for concurrent use.
func Resolve(s Strategy) (Strategy, error) {
	switch s {
	case "", Auto:
		v := os.Getenv(EnvStrategy)
		es, err := ParseStrategy(v)
		if err != nil {
			return "", fmt.Errorf("%s=%q: %w", EnvStrategy, v, err)
		}
		if es != Auto {
			return Resolve(es)
		}
		return autoStrategy(), nil
	case Cgroup, Track, Job:
		if err := usable(s); err != nil {
			return "", fmt.Errorf("the %s process-tree strategy is not usable here: %w", s, err)
		}
		return s, nil
	}
	return "", fmt.Errorf("%q is not a process-tree strategy (use auto, cgroup, track or job)", s)
}

// pollUntil calls cond with a growing interval (1ms up to 10ms) until it
// holds or the deadline passes (a zero deadline never passes). It is the
// fallback where nothing tells when a process has exited.
func pollUntil(deadline time.Time, cond func() bool) bool {
	d := time.Millisecond
	for !cond() {
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return false
			}
			d = min(d, left)
		}
		time.Sleep(d)
		d = min(2*d, 10*time.Millisecond)
	}
	return true
}

// Instance returns this process's marker instance, the same for the life
// of the process and different in every process, so that two timebox
// processes (or two test binaries) never mistake each other's
// subprocesses for their own. On Linux it names its owner,
// "<pid>.<start>.<pidns>" (the pid, its start time in clock ticks after
// boot, and the inode of its pid namespace), so that the next timebox on
// the machine can tell that the owner is gone and stop what it left
// behind (ReapOrphans); where that cannot be read it is "r" and 12 random
// hex digits, which no other process ever takes for a dead owner's.
func Instance() string { return instance() }

var instance = sync.OnceValue(func() string {
	if id, ok := ownInstance(); ok {
		return id
	}
	return randomInstance()
})

func randomInstance() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux; the pid still separates
		// processes alive at the same time.
		return fmt.Sprintf("p%011x", os.Getpid())
	}
	return "r" + hex.EncodeToString(b[:])
}

// Reaped is what ReapOrphans stopped.
type Reaped struct {
	// Processes is the number of processes it killed.
	Processes int
	// Owners are the pids of the gone timebox processes that left them.
	Owners []int
	// Unkilled is how many of them had not exited 5s after SIGKILL
	// (uninterruptible sleep); they are counted in Processes too.
	Unkilled int
	// Cgroups is the number of stale cgroup directories it removed.
	Cgroups int
}

// ErrNotStarted is wrapped, together with the context's cause, by the
// error Start returns when its context was done before the process could
// be started: the process was not started.
var ErrNotStarted = errors.New("not started")

// notStarted returns the error of a start that ctx ended first.
func notStarted(ctx context.Context) error {
	return fmt.Errorf("%w: %w", ErrNotStarted, context.Cause(ctx))
}

// calls numbers the calls of this process; the marker and the cgroup
// directory of a call carry its number.
var calls atomic.Uint64

// Process is a live process that carries this process's marker.
type Process struct {
	PID int
	// Marker is the process's TIMEBOX_CALL value.
	Marker string
	// Cmdline is its command line, arguments separated by spaces, for
	// messages.
	Cmdline string
}

func (p Process) String() string {
	return fmt.Sprintf("pid %d (%s) %s=%s", p.PID, p.Cmdline, EnvMarker, p.Marker)
}

// markerValue returns the TIMEBOX_CALL value for call n: its own marker,
// followed by the marker this process inherited, if any.
func markerValue(n uint64) string {
	v := instance() + "-" + strconv.FormatUint(n, 10)
	if outer := os.Getenv(EnvMarker); outer != "" {
		v += "," + outer
	}
	return v
}

// callOf returns the number of this process's call in a TIMEBOX_CALL value,
// and whether the value names one.
func callOf(value string) (uint64, bool) {
	prefix := instance() + "-"
	for value != "" {
		var elem string
		elem, value, _ = strings.Cut(value, ",")
		if rest, ok := strings.CutPrefix(elem, prefix); ok {
			if n, err := strconv.ParseUint(rest, 10, 64); err == nil {
				return n, true
			}
		}
	}
	return 0, false
}

// withMarker returns env without any TIMEBOX_CALL entry, plus the entry for
// value. A nil env means this process's environment, as in exec.Cmd.
func withMarker(env []string, value string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvMarker+"=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, EnvMarker+"="+value)
}
