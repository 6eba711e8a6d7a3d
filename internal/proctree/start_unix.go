//go:build linux || darwin

package proctree

import (
	"context"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
)

// starter starts every tree's root process, one at a time, on one
// goroutine locked to its own OS thread.
//
// One thread, because the root is started with PR_SET_PDEATHSIG (SIGKILL),
// so that it dies with timebox even when timebox is killed with SIGKILL
// and can clean nothing up. The kernel sends that signal when the thread
// that created the child exits, not the process, and a Go program's
// threads are shared by all its goroutines: a thread that started a tool
// could later run a goroutine that locks it and exits, and take the tool
// with it. This goroutine holds its thread for as long as a root it
// started has not been reaped, and only then returns, locked, which ends
// the thread.
//
// One at a time, because the fork is the moment after which a call can no
// longer be abandoned cheaply: the context is checked right before it, so
// that a call whose deadline passed while it waited (for its cgroup, for
// the start of a thousand others) ends without starting anything. Forks
// are serialised by Go anyway (syscall.ForkLock), so one goroutine costs
// no throughput.
type starter struct {
	// hook, when set (by tests), runs on the starter's thread before each
	// request is looked at.
	hook atomic.Pointer[func()]

	mu      sync.Mutex
	running bool
	// holds counts the starts queued or under way and the roots started
	// and not yet reaped; the goroutine ends when it drops to zero.
	holds int
	reqs  chan *startReq
	check chan struct{} // wakes the goroutine to see whether holds is zero
}

type startReq struct {
	ctx  context.Context
	cmd  *exec.Cmd
	done chan error
}

var starts = &starter{reqs: make(chan *startReq), check: make(chan struct{}, 1)}

// start starts cmd on the starter's thread, unless ctx is done first. A
// successful start holds the thread until release is called (after the
// root was reaped).
func (s *starter) start(ctx context.Context, cmd *exec.Cmd) error {
	s.mu.Lock()
	s.holds++
	if !s.running {
		s.running = true
		go s.loop()
	}
	s.mu.Unlock()
	r := &startReq{ctx: ctx, cmd: cmd, done: make(chan error, 1)}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		// Still queued: leave without starting anything.
		s.release()
		return notStarted(ctx)
	}
	err := <-r.done
	if err != nil {
		s.release()
	}
	return err
}

// release gives back a hold taken by start.
func (s *starter) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds--
	if s.holds == 0 {
		select {
		case s.check <- struct{}{}:
		default:
		}
	}
}

func (s *starter) loop() {
	// Never unlocked: see starter.
	runtime.LockOSThread()
	for {
		select {
		case r := <-s.reqs:
			if h := s.hook.Load(); h != nil {
				(*h)()
			}
			if r.ctx.Err() != nil {
				r.done <- notStarted(r.ctx)
				continue
			}
			r.done <- startOwn(func() (int, error) {
				if err := r.cmd.Start(); err != nil {
					return 0, err
				}
				return r.cmd.Process.Pid, nil
			})
		case <-s.check:
			s.mu.Lock()
			if s.holds == 0 {
				s.running = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
		}
	}
}
