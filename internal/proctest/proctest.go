// Package proctest checks that a test left no subprocess behind: every
// process timebox starts carries the marker TIMEBOX_CALL with this process's
// instance (internal/proctree), so a process that carries it after the
// test's calls have returned has leaked.
//
// Use it after every test that runs subprocess tools:
//
//	func TestCrawl(t *testing.T) {
//		proctest.AfterTest(t) // or defer proctest.CheckNoLeaks(t)
//		...
//	}
//
// The check covers every call of the test process, so it belongs where no
// other test is running subprocess calls at the same time: not inside a
// t.Parallel test whose siblings run tools (check after the parallel group,
// or in TestMain with Leaks).
package proctest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/proctree"
)

// Wait is how long CheckNoLeaks gives processes to finish exiting before
// it reports them: a stopped tree is gone when a call returns, but a
// process that was only just killed may still be on its way out (a zombie
// already counts as gone).
var Wait = 3 * time.Second

// CheckNoLeaks fails t (with Errorf, so the test's cleanups still run) if a
// live process carrying this test process's marker is still there after
// at most Wait, listing each with its pid and command line. It polls and
// returns as soon as none is left.
func CheckNoLeaks(t testing.TB) {
	t.Helper()
	if left := Leaks(Wait); len(left) > 0 {
		t.Errorf("%d subprocess(es) outlived their tool call:\n\t%s", len(left), strings.Join(left, "\n\t"))
	}
}

// AfterTest registers CheckNoLeaks as a cleanup of t, so it runs when the
// test and its subtests are done, after the cleanups registered before it.
func AfterTest(t testing.TB) {
	t.Helper()
	t.Cleanup(func() { CheckNoLeaks(t) })
}

// Leaks waits up to wait for every process carrying this process's marker
// to be gone and returns a description of each one still alive then, or
// nil. It suits TestMain, where there is no testing.TB:
//
//	code := m.Run()
//	if left := proctest.Leaks(proctest.Wait); left != nil { ... }
func Leaks(wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	interval := time.Millisecond
	for {
		procs, err := proctree.Running()
		if err != nil {
			return []string{fmt.Sprintf("cannot list processes: %v", err)}
		}
		if len(procs) == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			out := make([]string, len(procs))
			for i, p := range procs {
				out[i] = p.String()
			}
			return out
		}
		time.Sleep(min(interval, time.Until(deadline)))
		interval = min(2*interval, 50*time.Millisecond)
	}
}

// marks numbers the markers Env hands out, far above the numbers of this
// process's own calls, so that the two never meet.
var marks atomic.Uint64

// Env returns env (nil: this process's environment) with a TIMEBOX_CALL
// marker of this process in place of any it had, for a program started
// outside any process tree whose processes the test owns: a timebox
// binary under test. Leaks then counts that program, and every tool
// process it starts (their markers carry it after their own), as this
// process's: a timebox left running, or what it left, is a leak. A marker
// this process inherited stays after it, as proctree nests them.
func Env(env []string) []string {
	if env == nil {
		env = os.Environ()
	}
	value := proctree.Instance() + "-" + strconv.FormatUint(1<<62+marks.Add(1), 10)
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if outer, ok := strings.CutPrefix(kv, proctree.EnvMarker+"="); ok {
			if outer != "" {
				value += "," + outer
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, proctree.EnvMarker+"="+value)
}
