//go:build linux || darwin

package proctree

import (
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// tracker finds the processes of the calls run with the Track strategy.
// Finding them means looking at every process on the machine, so scans are
// shared: a call that needs one waits for the next scan to start and takes
// its share of the result. A thousand calls stopping at once cost a handful
// of scans, not a thousand.
type tracker struct {
	mu     sync.Mutex
	pgids  map[int]uint64 // process group → call number, for every tracked call
	busy   bool           // a scan is under way
	queued []scanRequest
}

type scanRequest struct {
	wanted map[uint64]bool
	ch     chan map[uint64][]procRef // nil received: lead the next scan
}

// procRef is a process a scan found, with a pidfd opened on it before its
// membership was (re)checked, so that the pidfd names the member and not a
// process that later got the same pid. The receiver owns fd; it is -1 when
// no pidfd could be had.
type procRef struct {
	pid     int
	fd      int
	inGroup bool // in the call's process group (else found by its marker)
}

var trk = &tracker{pgids: map[int]uint64{}}

// scans counts the /proc scans made for tracked calls, so that tests can
// see that concurrent stops share them.
var scans atomic.Int64

func (tr *tracker) add(n uint64, pgid int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.pgids[pgid] = n
}

func (tr *tracker) remove(pgid int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.pgids, pgid)
}

// members returns the processes of call n, from a scan that started after
// members was called (membersOf).
func (tr *tracker) members(n uint64) []procRef {
	return tr.membersOf(map[uint64]bool{n: true})[n]
}

// membersOf returns the processes of the wanted calls, by call, from a
// scan that started after membersOf was called. Concurrent callers share
// scans: the first runs one; those that arrive meanwhile queue, and when it
// ends the first of them runs the next for all of them, so that nobody
// waits for more than two. The caller owns the pidfds of what it wanted;
// those of calls it did not want are closed.
func (tr *tracker) membersOf(wanted map[uint64]bool) map[uint64][]procRef {
	tr.mu.Lock()
	if tr.busy {
		ch := make(chan map[uint64][]procRef, 1)
		tr.queued = append(tr.queued, scanRequest{wanted, ch})
		tr.mu.Unlock()
		if res := <-ch; res != nil {
			return res
		}
		tr.mu.Lock()
	}
	tr.busy = true
	batch := tr.queued
	tr.queued = nil
	all := make(map[uint64]bool, len(wanted))
	for n := range wanted {
		all[n] = true
	}
	for _, r := range batch {
		for n := range r.wanted {
			all[n] = true
		}
	}
	pgids := make(map[int]uint64, len(tr.pgids))
	for k, v := range tr.pgids {
		pgids[k] = v
	}
	tr.mu.Unlock()

	res := scan(pgids, all)

	tr.mu.Lock()
	for _, r := range batch {
		r.ch <- pick(res, r.wanted)
	}
	if len(tr.queued) > 0 {
		// Hand the next scan to the first in line rather than running it
		// here, so that the caller that led this one is not held up.
		next := tr.queued[0]
		tr.queued = tr.queued[1:]
		next.ch <- nil
	} else {
		tr.busy = false
	}
	tr.mu.Unlock()
	return pick(res, wanted)
}

// pick returns the part of a scan's result a caller wanted. Every call
// number is wanted by one caller at a time (a tree's own, or the sweeper
// once its tree is done), so each pidfd has one owner.
func pick(res map[uint64][]procRef, wanted map[uint64]bool) map[uint64][]procRef {
	out := make(map[uint64][]procRef, len(wanted))
	for n := range wanted {
		if refs, ok := res[n]; ok {
			out[n] = refs
		}
	}
	return out
}

// strangers remembers, by pidfd, processes a scan found not to belong to
// any call, so that later scans need not read their environment again: as
// long as a pidfd's process has not exited, its pid still names it (a pid
// is reused only after its process is gone), and a process that carried no
// marker when it started cannot come to carry one it never saw. One poll
// over all the pidfds tells which have exited. At most maxStrangers are
// kept, each an open file descriptor. Only the goroutine running a scan
// (there is one at a time) uses it.
var strangers = map[int]int{} // pid → pidfd

const maxStrangers = 1024

// forgetExited drops the strangers whose process has exited.
func forgetExited() {
	if len(strangers) == 0 {
		return
	}
	fds := make([]unix.PollFd, 0, len(strangers))
	for _, fd := range strangers {
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	for {
		_, err := unix.Poll(fds, 0)
		if err != unix.EINTR {
			break
		}
	}
	exited := make(map[int32]bool)
	for _, p := range fds {
		if p.Revents != 0 {
			exited[p.Fd] = true
		}
	}
	for pid, fd := range strangers {
		if exited[int32(fd)] {
			unix.Close(fd)
			delete(strangers, pid)
		}
	}
}

// scan finds the processes of the wanted calls: those in a call's process
// group, and those whose environment carries a call's marker. pgids maps
// the process group of every tracked call (wanted or not) to its number.
// A member may be a zombie; the receiver's pidfd says so.
//
// The checks are ordered by cost: getpgid is one system call; a known
// stranger costs nothing more; reading /proc/<pid>/environ is three calls
// and touches the process's memory map. /proc/<pid>/stat, dearer still
// (the kernel sums every thread's CPU time to fill it), is not read.
func scan(pgids map[int]uint64, wanted map[uint64]bool) map[uint64][]procRef {
	res := make(map[uint64][]procRef, len(wanted))
	scans.Add(1)
	all, err := pids()
	if err != nil {
		return res
	}
	forgetExited()
	self := os.Getpid()
	buf := make([]byte, 0, 4096)
	for _, pid := range all {
		if pid == self {
			continue
		}
		pgrp, err := unix.Getpgid(pid)
		if err != nil {
			continue // gone
		}
		if n, ok := pgids[pgrp]; ok {
			if !wanted[n] {
				continue
			}
			fd, err := openPidfd(pid)
			if err == unix.ESRCH {
				continue
			}
			// Without a pidfd (no kernel support, no descriptors left) the
			// member is still reported, to be followed by its pid.
			if again, err := unix.Getpgid(pid); err != nil || again != pgrp {
				closeFD(fd)
				continue
			}
			res[n] = append(res[n], procRef{pid: pid, fd: fd, inGroup: true})
			continue
		}
		if _, ok := strangers[pid]; ok {
			continue
		}
		// The pidfd is opened before the environment is read: if the
		// process it names has exited by then and the pid was reused,
		// the pidfd reads as exited (the next scan drops it, and a
		// member's tree counts it as gone and looks again).
		fd, err := openPidfd(pid)
		if err == unix.ESRCH {
			continue
		}
		var v string
		var marked bool
		v, marked, buf = readMarker(pid, buf)
		n, ours := uint64(0), false
		if marked {
			n, ours = callOf(v)
		}
		switch {
		case ours && wanted[n]:
			res[n] = append(res[n], procRef{pid: pid, fd: fd})
		case !ours && fd >= 0 && len(strangers) < maxStrangers:
			strangers[pid] = fd
		default:
			closeFD(fd)
		}
	}
	return res
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}
