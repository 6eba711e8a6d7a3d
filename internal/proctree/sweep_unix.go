//go:build linux || darwin

package proctree

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// sweeper stops, shortly after they end, whatever of the calls that ended
// on their own is outside their cgroup: a process that moved itself out
// (a privileged one can) keeps the call's marker. A call that is stopped
// looks for its escapees itself, before it returns (Tree.Stop); one that
// ended on its own hands its number here, so that the end of every call
// does not pay a scan of /proc (0.15 ms, a quarter of a small tool's
// call): the calls that end within sweepDelay share one scan, and an
// escapee of theirs gets SIGKILL within about sweepDelay plus a scan —
// well within a kill grace.
//
// Its goroutine runs while there are calls to look for, and ends when
// there are none.
type sweeper struct {
	mu      sync.Mutex
	pending map[uint64]bool
	running bool
}

// sweepDelay is how long the sweeper gathers ended calls before it scans.
const sweepDelay = 250 * time.Millisecond

var sweeps = &sweeper{pending: map[uint64]bool{}}

// escapedTotal counts the processes found outside their call's cgroup and
// stopped, by a call's stop or by the sweeper.
var escapedTotal atomic.Int64

// EscapedTotal returns how many processes were found outside their call's
// cgroup (moved out by a privileged process) and stopped, since this
// process started.
func EscapedTotal() int64 { return escapedTotal.Load() }

// add asks for call n's escapees to be stopped.
func (s *sweeper) add(n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[n] = true
	if !s.running {
		s.running = true
		go s.loop()
	}
}

func (s *sweeper) loop() {
	for {
		time.Sleep(sweepDelay)
		s.mu.Lock()
		batch := s.pending
		s.pending = map[uint64]bool{}
		s.mu.Unlock()
		found := trk.membersOf(batch)

		for _, refs := range found {
			for _, ref := range refs {
				h := newHandle(ref.pid, ref.fd)
				if !h.exited() {
					h.signal(unix.SIGKILL)
					escapedTotal.Add(1)
				}
				h.close()
			}
		}
		s.mu.Lock()
		if len(s.pending) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}
