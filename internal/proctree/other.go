//go:build !linux && !darwin && !windows

package proctree

import (
	"context"
	"errors"
	"os/exec"
	"time"
)

var errUnsupported = errors.New("process trees are owned on Linux only")

func cgroupUsable() error { return errUnsupported }

func ownInstance() (string, bool) { return "", false }

// Tree is the process tree of one started command. Only Linux has them.
type Tree struct{}

// Start returns an error: process trees are owned on Linux only.
func Start(ctx context.Context, cmd *exec.Cmd, s Strategy) (*Tree, error) { return nil, errUnsupported }

// Strategy returns the tree's strategy.
func (t *Tree) Strategy() Strategy { return "" }

// Marker returns the tree's marker.
func (t *Tree) Marker() string { return "" }

// PID returns the root's pid.
func (t *Tree) PID() int { return 0 }

// Exited returns a closed channel.
func (t *Tree) Exited() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Stop does nothing.
func (t *Tree) Stop(grace time.Duration) {}

// Wait returns an error.
func (t *Tree) Wait() error { return errUnsupported }

// Unkilled returns nil.
func (t *Tree) Unkilled() []int { return nil }

// Escaped returns nil: see the Linux implementation.
func (t *Tree) Escaped() []int { return nil }

// EscapedTotal returns 0.
func EscapedTotal() int64 { return 0 }

// UnkilledRunning returns 0.
func UnkilledRunning() int64 { return 0 }

// Running returns an error: process trees are owned on Linux only.
func Running() ([]Process, error) { return nil, errUnsupported }

// ReapOrphans does nothing: process trees are owned on Linux only.
func ReapOrphans() (Reaped, error) { return Reaped{}, nil }

// ReapedTotal returns 0.
func ReapedTotal() int64 { return 0 }

// Close does nothing.
func Close() {}

// CgroupMembers returns nil: there are no cgroups.
func CgroupMembers(owner int) ([]int, error) { return nil, nil }

func autoStrategy() Strategy { return Track }

func usable(Strategy) error { return errUnsupported }
