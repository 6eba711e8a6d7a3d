package proctree

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A process that is PID 1 (timebox as a container's entrypoint, without
// an init before it) is the parent of every orphan in its PID namespace:
// a tool's child whose parent died first, a killed tree's members. Nobody
// else reaps them, and each dead one stays a zombie, holding a PID, until
// the container's PID limit is reached. ReapAdopted reaps them.
//
// The roots this package starts are its own children too, reaped by
// Tree.Wait; they are registered as they are started (under ownMu, so
// that a root that exits at once is never taken for an orphan), and the
// reaper leaves them alone.
var (
	ownMu sync.Mutex
	own   = map[int]bool{}

	adoptOnce sync.Once
)

// startOwn runs start (the fork of a root) and registers the root's pid,
// with the reaper held off for both.
func startOwn(start func() (int, error)) error {
	ownMu.Lock()
	defer ownMu.Unlock()
	pid, err := start()
	if err == nil {
		own[pid] = true
	}
	return err
}

// forgetOwn notes that root pid has been reaped.
func forgetOwn(pid int) {
	ownMu.Lock()
	delete(own, pid)
	ownMu.Unlock()
}

// ReapAdopted starts reaping, for as long as the process lives, the
// children it adopts, when it is PID 1 (or asked to by a test that made
// it a subreaper: force). Every child the process starts itself must go
// through Start: any other would be reaped under its os/exec's feet.
func ReapAdopted(force bool) {
	if os.Getpid() != 1 && !force {
		return
	}
	adoptOnce.Do(func() {
		chld := make(chan os.Signal, 1)
		signal.Notify(chld, syscall.SIGCHLD)
		go func() {
			t := time.NewTicker(time.Second)
			for {
				select {
				case <-chld:
				case <-t.C:
				}
				reapZombies()
			}
		}()
	})
}

// reapZombies reaps this process's children that are zombies and not
// roots of its own.
func reapZombies() {
	self := os.Getpid()
	ownMu.Lock()
	defer ownMu.Unlock()
	ps, err := pids()
	if err != nil {
		return
	}
	for _, pid := range ps {
		if own[pid] {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != self || st.state != 'Z' {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}
