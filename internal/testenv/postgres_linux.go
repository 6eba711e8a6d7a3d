package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Freeze stops the server with SIGSTOP, its postmaster and every process
// of it, so that it answers nothing while its connections stay open and
// its port takes new ones into the kernel's queue: a database that hangs
// (a stalled disk, a frozen VM), not one that is down. Thaw ends it.
func (s *PostgresServer) Freeze() { s.signalAll(syscall.SIGSTOP, 0) }

// Thaw lets a frozen server (Freeze) go on.
func (s *PostgresServer) Thaw() { s.signalAll(syscall.SIGCONT, 0) }

// ThawBut lets a frozen server (Freeze) go on, all but its backend pid,
// which stays stopped until Thaw: a backend whose statement is held while
// the rest of the database answers.
func (s *PostgresServer) ThawBut(pid int) { s.signalAll(syscall.SIGCONT, pid) }

// signalAll sends sig to the postmaster and its children, but the process
// but (0: none). A stop stops the postmaster first, so that it forks no
// child after the list is read; a continue continues it last.
func (s *PostgresServer) signalAll(sig syscall.Signal, but int) {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.c.data(), "postmaster.pid"))
	if err != nil {
		s.t.Fatalf("the postmaster's pid: %v", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		s.t.Fatalf("the postmaster's pid: %q: %v", line, err)
	}
	if sig == syscall.SIGSTOP {
		if err := syscall.Kill(pm, sig); err != nil {
			s.t.Fatalf("signalling the postmaster: %v", err)
		}
	}
	for _, pid := range childrenOf(pm) {
		if pid != but {
			syscall.Kill(pid, sig)
		}
	}
	if sig != syscall.SIGSTOP {
		if err := syscall.Kill(pm, sig); err != nil {
			s.t.Fatalf("signalling the postmaster: %v", err)
		}
	}
}

// childrenOf lists the processes whose parent is pid (field 4 of
// /proc/PID/stat).
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}
