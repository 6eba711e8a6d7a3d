package proctree

import (
	"context"
	"errors"
	"syscall"
	"time"
)

// macOS has no cgroups: Resolve never picks the Cgroup strategy there, so
// a Tree's cgroup is always nil. These stand in for the Linux ones so that
// the code shared with Linux compiles.

var errNoCgroups = errors.New("macOS has no cgroups")

type cgroupHost struct{}

type callCgroup struct{}

func cgHost() (*cgroupHost, error) { return nil, errNoCgroups }

func cgroupUsable() error { return errNoCgroups }

func newCallCgroup(context.Context, uint64, *syscall.SysProcAttr) (*callCgroup, error) {
	return nil, errNoCgroups
}

func (*cgroupHost) reapStale() (procs, dirs int, owners []int, unkilled int, err error) {
	return 0, 0, nil, 0, nil
}

func (*callCgroup) release()                 {}
func (*callCgroup) populated() bool          { return false }
func (*callCgroup) procs() []int             { return nil }
func (*callCgroup) has(int) bool             { return false }
func (*callCgroup) kill() error              { return errNoCgroups }
func (*callCgroup) waitEmpty(time.Time) bool { return true }

// Close does nothing: there are no cgroup directories to remove.
func Close() {}

// CgroupMembers returns nil: there are no cgroups.
func CgroupMembers(owner int) ([]int, error) { return nil, nil }
