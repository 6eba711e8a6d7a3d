//go:build windows

package proctree

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// On Windows a call's tree is a Job Object. The root is created suspended,
// put in a job of its own and only then resumed, so every process it starts
// is in the job before it can start one; the job does not allow breakaway,
// so nothing leaves it. The job kills its processes when its last handle
// is closed (JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE), and the only handle is
// timebox's: when timebox exits, however it exits, Windows closes it and
// the tools go with it. There is nothing for ReapOrphans to do.
//
// The polite stop is CTRL_BREAK_EVENT to the root's process group (the
// root leads a new one); it reaches the processes that share timebox's
// console. A timebox without a console cannot send it, and the job is
// terminated at once.

// Tree is the process tree of one started command: its root process and
// every process started under it, all in one job object. Exited is safe
// for concurrent use; Stop and Wait serialise with each other.
type Tree struct {
	cmd    *exec.Cmd
	n      uint64
	marker string
	pid    int
	job    windows.Handle
	proc   windows.Handle // the root, for its exit
	exited chan struct{}

	mu       sync.Mutex
	gone     bool // the job had no process left after the root exited
	unkilled []int
	waited   bool
	err      error
}

// unkillableAfter is how long a tree waits for its processes to exit once
// its job was terminated; see the Linux implementation.
var unkillableAfter = 5 * time.Second

var unkilledRunning atomic.Int64

// UnkilledRunning returns the number of processes of stopped trees that
// had not exited unkillableAfter (5s) after their job was terminated.
func UnkilledRunning() int64 { return unkilledRunning.Load() }

// autoStrategy is what Auto resolves to: Windows has job objects.
func autoStrategy() Strategy { return Job }

// usable reports whether strategy s works here: only Job on Windows.
func usable(s Strategy) error {
	if s == Job {
		return nil
	}
	return fmt.Errorf("%s is not available on Windows (use job)", s)
}

// ownInstance reports no owner-naming instance: a job dies with its
// owner, so no later timebox needs to recognise a dead one's processes.
func ownInstance() (string, bool) { return "", false }

// Start starts cmd, which must not have been started, as the root of a new
// tree in a job object of its own. It sets cmd.SysProcAttr (a copy of the
// caller's, with CREATE_NEW_PROCESS_GROUP and CREATE_SUSPENDED added) and
// cmd.Env (the marker TIMEBOX_CALL is added).
//
// If ctx is done before the process is started nothing is started and the
// error wraps ErrNotStarted and context.Cause(ctx). The caller must call
// Wait once the tree is done with.
func Start(ctx context.Context, cmd *exec.Cmd, s Strategy) (*Tree, error) {
	if _, err := Resolve(s); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, notStarted(ctx)
	}
	job, err := newJob()
	if err != nil {
		return nil, fmt.Errorf("making the call's job object: %w", err)
	}
	n := calls.Add(1)
	t := &Tree{cmd: cmd, n: n, marker: markerValue(n), job: job, exited: make(chan struct{})}
	attr := &syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		cp := *cmd.SysProcAttr
		attr = &cp
	}
	attr.CreationFlags |= windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_SUSPENDED
	cmd.SysProcAttr = attr
	cmd.Env = withMarker(cmd.Env, t.marker)
	if ctx.Err() != nil {
		windows.CloseHandle(job)
		return nil, notStarted(ctx)
	}
	if err := cmd.Start(); err != nil {
		windows.CloseHandle(job)
		return nil, err
	}
	t.pid = cmd.Process.Pid
	proc, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE|
		windows.SYNCHRONIZE|windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(t.pid))
	if err == nil {
		err = windows.AssignProcessToJobObject(job, proc)
		if err == nil {
			err = resume(t.pid)
		}
		if err != nil {
			windows.CloseHandle(proc)
		}
	}
	if err != nil {
		// Still suspended: it has run no code and started nothing.
		cmd.Process.Kill()
		cmd.Wait()
		windows.CloseHandle(job)
		return nil, fmt.Errorf("putting process %d in its job object: %w", t.pid, err)
	}
	t.proc = proc
	go t.watchRoot()
	return t, nil
}

// newJob makes a job object that kills its processes when closed.
func newJob() (windows.Handle, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, err
	}
	var info windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return 0, err
	}
	return job, nil
}

// resume resumes every thread of process pid, which was created suspended
// (os/exec does not return its thread's handle).
func resume(pid int) error {
	snap, err := windows.CreateToolhelp32Snapshot(windows.TH32CS_SNAPTHREAD, 0)
	if err != nil {
		return err
	}
	defer windows.CloseHandle(snap)
	var e windows.ThreadEntry32
	e.Size = uint32(unsafe.Sizeof(e))
	resumed := 0
	for err = windows.Thread32First(snap, &e); err == nil; err = windows.Thread32Next(snap, &e) {
		if e.OwnerProcessID != uint32(pid) {
			continue
		}
		th, err := windows.OpenThread(windows.THREAD_SUSPEND_RESUME, false, e.ThreadID)
		if err != nil {
			return err
		}
		_, err = windows.ResumeThread(th)
		windows.CloseHandle(th)
		if err != nil {
			return err
		}
		resumed++
	}
	if resumed == 0 {
		return errors.New("no thread of it was found to resume")
	}
	return nil
}

func (t *Tree) watchRoot() {
	defer close(t.exited)
	windows.WaitForSingleObject(t.proc, windows.INFINITE)
}

// Strategy returns Job.
func (t *Tree) Strategy() Strategy { return Job }

// Marker returns the TIMEBOX_CALL value the tree's processes carry.
func (t *Tree) Marker() string { return t.marker }

// PID returns the root process's pid.
func (t *Tree) PID() int { return t.pid }

// Exited returns a channel that is closed when the root process has exited
// (other processes of the tree may still be running).
func (t *Tree) Exited() <-chan struct{} { return t.exited }

// Stop stops the tree: CTRL_BREAK_EVENT to the root's process group, then,
// after grace or as soon as the job is empty, TerminateJobObject. It
// returns when no process of the job is alive. With a grace of zero or
// less, or when the break cannot be sent (no console), it terminates the
// job at once. Stop after Wait does nothing.
func (t *Tree) Stop(grace time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waited || t.gone || t.unkilled != nil {
		return
	}
	if grace > 0 && windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(t.pid)) == nil {
		if t.waitEmpty(time.Now().Add(grace)) {
			return
		}
	}
	t.kill()
}

// kill terminates the job and waits until it is empty, or until
// unkillableAfter, when it records what is still alive in t.unkilled.
func (t *Tree) kill() {
	windows.TerminateJobObject(t.job, 1)
	if t.waitEmpty(time.Now().Add(unkillableAfter)) {
		return
	}
	t.unkilled = t.processes()
	if t.unkilled == nil {
		t.unkilled = []int{}
	}
}

// waitEmpty waits until the job has no active process, or the deadline.
func (t *Tree) waitEmpty(deadline time.Time) bool {
	if pollUntil(deadline, func() bool { return t.active() == 0 }) {
		t.gone = true
		return true
	}
	return false
}

// basicAccounting is JOBOBJECT_BASIC_ACCOUNTING_INFORMATION.
type basicAccounting struct {
	TotalUserTime, TotalKernelTime                     int64
	ThisPeriodTotalUserTime, ThisPeriodTotalKernelTime int64
	TotalPageFaultCount, TotalProcesses                uint32
	ActiveProcesses, TotalTerminatedProcesses          uint32
}

// active returns the number of live processes in the job (-1 when it
// cannot be read, which keeps a wait waiting until its deadline).
func (t *Tree) active() int {
	var info basicAccounting
	if err := windows.QueryInformationJobObject(t.job, windows.JobObjectBasicAccountingInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info)), nil); err != nil {
		return -1
	}
	return int(info.ActiveProcesses)
}

// processIDList is JOBOBJECT_BASIC_PROCESS_ID_LIST with room for 1024.
type processIDList struct {
	Assigned, InList uint32
	IDs              [1024]uintptr
}

// processes returns the pids of the job's live processes.
func (t *Tree) processes() []int {
	var l processIDList
	if err := windows.QueryInformationJobObject(t.job, windows.JobObjectBasicProcessIdList,
		uintptr(unsafe.Pointer(&l)), uint32(unsafe.Sizeof(l)), nil); err != nil {
		return nil
	}
	var out []int
	for _, id := range l.IDs[:min(int(l.InList), len(l.IDs))] {
		out = append(out, int(id))
	}
	slices.Sort(out)
	return out
}

// Wait terminates whatever is left of the job, waits until no process of
// it is alive, waits for the root and closes the job. It returns the
// root's exit as cmd.Wait does. Calls after the first return the same.
func (t *Tree) Wait() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waited {
		return t.err
	}
	t.waited = true
	if !t.gone && t.unkilled == nil && t.active() != 0 {
		t.kill()
	}
	wait := time.NewTimer(unkillableAfter)
	select {
	case <-t.exited:
	case <-wait.C:
	}
	wait.Stop()
	if !closed(t.exited) {
		if !slices.Contains(t.unkilled, t.pid) {
			t.unkilled = append(t.unkilled, t.pid)
		}
		unkilledRunning.Add(int64(len(t.unkilled)))
		t.err = fmt.Errorf("process %d did not exit within %s of the termination of its job", t.pid, unkillableAfter)
		go func(n int) {
			<-t.exited
			t.cmd.Wait()
			t.close()
			unkilledRunning.Add(-int64(n))
		}(len(t.unkilled))
		return t.err
	}
	t.err = t.cmd.Wait()
	t.close()
	return t.err
}

// close closes the root's handle and the job (which kills whatever might
// still be in it).
func (t *Tree) close() {
	windows.CloseHandle(t.proc)
	windows.CloseHandle(t.job)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Unkilled returns the pids of the processes of the tree still alive
// unkillableAfter (5s) after the job was terminated; nil when every
// process exited.
func (t *Tree) Unkilled() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.unkilled)
}

// Escaped returns nil: no process leaves a job that does not allow
// breakaway.
func (t *Tree) Escaped() []int { return nil }

// EscapedTotal returns 0: see Escaped.
func EscapedTotal() int64 { return 0 }

// Running returns an error: Windows does not let one process read
// another's environment cheaply, and a job holds every process of a call,
// so the marker is not scanned for.
func Running() ([]Process, error) {
	return nil, errors.New("listing processes by marker is not supported on Windows")
}

// ReapOrphans does nothing: a job's processes die with the timebox that
// made it.
func ReapOrphans() (Reaped, error) { return Reaped{}, nil }

// ReapedTotal returns 0: see ReapOrphans.
func ReapedTotal() int64 { return 0 }

// Close does nothing: jobs are closed by their trees' Wait.
func Close() {}

// CgroupMembers returns nil: Windows has no cgroups.
func CgroupMembers(owner int) ([]int, error) { return nil, nil }

// ReapAdopted does nothing on Windows, which has no zombies to reap.
func ReapAdopted(force bool) {}
