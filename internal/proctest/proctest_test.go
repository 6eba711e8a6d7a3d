//go:build linux

package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/internal/proctree"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "proctest-hang" {
		time.Sleep(time.Hour)
		syscall.Exit(0)
	}
	// proctree.Close removes the idle cgroups now rather than leave them
	// for the next process to clean up.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { proctree.Close(); os.Exit(code) }))
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestCheckNoLeaksClean(t *testing.T) {
	r := &recorder{TB: t}
	t0 := time.Now()
	CheckNoLeaks(r)
	if len(r.errors) > 0 {
		t.Errorf("a clean process reported leaks: %v", r.errors)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("a clean check took %s; it must return as soon as nothing is left", d)
	}
}

func TestCheckNoLeaksReportsMarkedProcess(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A process that carries this process's marker, as a leaked tool
	// descendant would, started outside any tree.
	cmd := exec.Command(self, "proctest-hang")
	cmd.Env = append(os.Environ(), proctree.EnvMarker+"="+proctree.Instance()+"-424242")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// And one with another process's instance, which is not ours to report.
	other := exec.Command(self, "proctest-hang")
	other.Env = append(os.Environ(), proctree.EnvMarker+"=0123456789ab-1")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		other.Process.Kill()
		other.Wait()
	}()

	old := Wait
	Wait = 100 * time.Millisecond
	defer func() { Wait = old }()
	r := &recorder{TB: t}
	CheckNoLeaks(r)
	if len(r.errors) != 1 {
		t.Fatalf("errors %v, want one", r.errors)
	}
	msg := r.errors[0]
	if !strings.Contains(msg, fmt.Sprintf("pid %d", cmd.Process.Pid)) || !strings.Contains(msg, "proctest-hang") ||
		strings.Contains(msg, fmt.Sprintf("pid %d", other.Process.Pid)) {
		t.Errorf("message %q names the wrong processes", msg)
	}
}

func TestLeaksWaitsForExit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "proctest-hang")
	cmd.Env = append(os.Environ(), proctree.EnvMarker+"="+proctree.Instance()+"-424243")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond) // a process on its way out
		cmd.Process.Kill()
		cmd.Wait()
	}()
	if left := Leaks(5 * time.Second); left != nil {
		t.Errorf("Leaks did not wait for the exit: %v", left)
	}
	<-done
}

// TestEnvMarksAProgramAndItsChildren: a program started with Env, and the
// child it starts, are this process's leaks; once they exit, nothing is.
func TestEnvMarksAProgramAndItsChildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 300 & echo started; wait")
	cmd.Env = Env(append(os.Environ(), proctree.EnvMarker+"=outer-1"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group at the end
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Process.Kill()
		cmd.Wait()
	}()
	buf := make([]byte, 16)
	if n, _ := out.Read(buf); !strings.Contains(string(buf[:n]), "started") {
		t.Fatalf("the program said %q", buf[:n])
	}
	left := Leaks(0)
	if len(left) != 2 || !strings.Contains(strings.Join(left, "\n"), "sleep 300") || !strings.Contains(left[0], ",outer-1") {
		t.Fatalf("Leaks = %q; want the shell and its sleep, their marker nesting the inherited one", left)
	}
	var n int
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, proctree.EnvMarker+"=") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d markers in the environment", n)
	}
}
