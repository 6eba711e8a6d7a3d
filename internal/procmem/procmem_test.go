package procmem

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "procmem-grow" {
		// Touch 64 MiB, then wait to be killed.
		b := make([]byte, 64<<20)
		for i := range b {
			if i%4096 == 0 {
				b[i] = 1
			}
		}
		os.Stdout.WriteString("grown\n")
		time.Sleep(time.Hour)
		runtime.KeepAlive(b)
		return
	}
	goleak.VerifyTestMain(m)
}

// TestWatchSeesTheChildNotTheParent: a child that grows to 64 MiB reads as
// at least that, and Watch returns once it is killed; a child of a parent
// that grew large does not read as large as its parent.
func TestWatchSeesTheChildNotTheParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// This process holds 256 MiB while it starts the child: getrusage's
	// maxrss of the child would count them.
	ballast := make([]byte, 256<<20)
	for i := range ballast {
		if i%4096 == 0 {
			ballast[i] = 1
		}
	}
	cmd := exec.Command(self, "procmem-grow")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	peak := Watch(cmd.Process.Pid)
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if !strings.Contains(string(buf[:n]), "grown") {
		t.Fatalf("the child said %q", buf[:n])
	}
	time.Sleep(3 * Interval) // a sample after the growth
	live := Peak(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	runtime.KeepAlive(ballast)
	got := peak()
	if got < 64<<20 || got > 200<<20 || live < 64<<20 {
		t.Errorf("peak %d MiB (live %d MiB), want 64 MiB and more, well under the parent's 256 MiB", got>>20, live>>20)
	}
	if Peak(cmd.Process.Pid) != 0 {
		t.Errorf("a reaped process has a peak")
	}
}
