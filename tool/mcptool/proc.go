package mcptool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/tool/runas"
)

// proc is a stdio server's process tree, owned through internal/proctree
// (a cgroup of its own where the machine allows, else its process group and
// the TIMEBOX_CALL marker its descendants inherit). When the server's root
// process exits, or the server is stopped, whatever is left of the tree is
// killed, so that no child of a server (npx starts node, node may start
// more, some of them in a session of their own) outlives it.
type proc struct {
	tree   *proctree.Tree
	pid    int
	stdin  *os.File // our end of the server's stdin
	stdout *os.File // our end of the server's stdout
	stderr *tail

	exited   chan struct{} // closed once the tree is gone and the root reaped
	err      error         // the root's exit status; read after exited
	killed   atomic.Bool   // timebox stopped the tree
	stopOnce sync.Once
}

// startProc starts argv as the root of a new process tree. Pipes are made
// here rather than by exec.Cmd so that the output stays readable after the
// process is reaped: the server's last reply must not be lost to Wait
// closing a pipe. ctx bounds the wait to be started only: once the server
// runs, it lives until stopped.
func startProc(ctx context.Context, argv, env []string, dir string, as *runas.Identity, log io.Writer) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	if as != nil {
		if err := as.Apply(cmd); err != nil {
			return nil, err
		}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW)
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	tree, err := proctree.Start(ctx, cmd, proctree.Auto)
	closeAll(inR, outW, errW)
	if err != nil {
		closeAll(inW, outR, errR)
		return nil, err
	}
	p := &proc{tree: tree, pid: tree.PID(), stdin: inW, stdout: outR, stderr: &tail{max: 4 << 10},
		exited: make(chan struct{})}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		w := io.Writer(p.stderr)
		if log != nil {
			w = io.MultiWriter(p.stderr, log)
		}
		_, _ = io.Copy(w, errR)
	}()
	go p.wait(errR, drained)
	return p, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// wait waits for the root to exit, kills what is left of the tree and reaps
// the root, and makes sure the stderr and stdout readers end even if
// something outside the tree still holds the pipes.
func (p *proc) wait(errR *os.File, drained chan struct{}) {
	<-p.tree.Exited()
	// The rest of the tree outlives its root only as orphans of a server
	// that no longer exists.
	p.err = p.tree.Wait()
	t := time.NewTimer(time.Second)
	select {
	case <-drained:
		t.Stop()
	case <-t.C:
		_ = errR.Close()
		<-drained
	}
	// The SDK reads stdout until EOF; cut it if something still keeps it
	// open, so that the session ends.
	time.AfterFunc(time.Second, func() { _ = p.stdout.Close() })
	close(p.exited)
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// kill kills the tree at once and waits until it is gone.
func (p *proc) kill() {
	if !p.hasExited() {
		p.killed.Store(true)
		p.tree.Stop(0)
	}
	<-p.exited
}

// stop asks the server to exit the MCP way, by closing its input; after
// grace the tree gets SIGTERM, and after grace again SIGKILL. It returns
// when the tree is gone and the root reaped.
func (p *proc) stop(grace time.Duration) {
	p.stopOnce.Do(func() {
		_ = p.stdin.Close()
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
		p.killed.Store(true)
		p.tree.Stop(grace)
	})
	<-p.exited
}

// killedByUs reports whether timebox stopped the tree; valid after exited.
func (p *proc) killedByUs() bool { return p.killed.Load() }

// exitText describes how the root ended, valid after exited.
func (p *proc) exitText() string {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %s", ws.Signal())
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if p.err != nil {
		return p.err.Error()
	}
	return "exit status 0"
}

// stderrTail returns the end of the server's log.
func (p *proc) stderrTail() string { return p.stderr.String() }

// stderrText is the log's end for a one-line message, or "".
func (p *proc) stderrText() string {
	s := strings.TrimSpace(p.stderr.String())
	if s == "" {
		return ""
	}
	return "; its stderr ends: " + tailString(s, 1024)
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

// Write keeps the last max bytes written; it never fails.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// String returns the bytes kept, with what is not UTF-8 replaced.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(string(t.b), "\uFFFD")
}
