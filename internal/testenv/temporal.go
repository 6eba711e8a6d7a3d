package testenv

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
)

// EnvTemporal names the Temporal CLI binary to start the dev server with;
// unset, `temporal` is looked up on PATH. `.ci/run` builds it (go install
// github.com/temporalio/cli/cmd/temporal@v1.5.1) into a cache directory.
const EnvTemporal = "TB_TEST_TEMPORAL"

// EnvTemporalDefaults, set to 1, starts the dev servers with Temporal's
// default settings (four task-queue partitions, no eager activities), to
// measure what the settings of start do.
const EnvTemporalDefaults = "TB_TEST_TEMPORAL_DEFAULTS"

// Temporal returns the host:port of a Temporal dev server (`temporal
// server start-dev --headless`) for the test binary, on free loopback
// ports with its own database file in a temporary directory, started at
// the first call: call StopTemporal from TestMain. It skips t (fails it
// when temporal is required, TB_TEST_REQUIRE) when the CLI is missing or
// the server does not start.
func Temporal(t testing.TB) string {
	t.Helper()
	temporalMu.Lock()
	defer temporalMu.Unlock()
	if temporalSrv == nil && temporalErr == nil {
		temporalSrv, temporalErr = startTemporal()
	}
	if temporalErr != nil {
		Unavailable(t, "temporal", temporalErr.Error())
	}
	return temporalSrv.addr
}

// StopTemporal stops the dev server Temporal started, if any.
func StopTemporal() {
	temporalMu.Lock()
	defer temporalMu.Unlock()
	if temporalSrv != nil {
		temporalSrv.stop()
		temporalSrv = nil
	}
}

var (
	temporalMu  sync.Mutex
	temporalSrv *devServer
	temporalErr error
)

type devServer struct {
	addr  string
	dir   string
	bin   string
	ports [3]int
	db    string
	cmd   *exec.Cmd
	out   *bytes.Buffer
	done  chan struct{}
}

func startTemporal() (*devServer, error) {
	bin := os.Getenv(EnvTemporal)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("temporal"); err != nil {
			return nil, fmt.Errorf("the Temporal CLI is not installed: go install github.com/temporalio/cli/cmd/temporal@v1.5.1, and put it on PATH or in %s", EnvTemporal)
		}
	}
	reapStaleTemporal()
	dir, err := os.MkdirTemp("", "timebox-temporal-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(ownerStamp(os.Getpid())), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &devServer{dir: dir, bin: bin, db: filepath.Join(dir, "temporal.db")}
	if err := onFreePorts(len(s.ports), func(ports []int) error {
		copy(s.ports[:], ports)
		s.addr = fmt.Sprintf("127.0.0.1:%d", s.ports[0])
		return s.start()
	}); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// start starts the server process on its ports and database, and waits
// until it answers.
//
// One task-queue partition and eager activities: with the default four
// partitions a task waits about 40ms for a poller of another partition,
// and without eager activities a tool call waits for a poll after the
// workflow task that scheduled it (docs/temporal.md, "Latency").
func (s *devServer) start() error {
	s.out, s.done = &bytes.Buffer{}, make(chan struct{})
	args := []string{"server", "start-dev", "--headless", "--ip", "127.0.0.1",
		"--port", fmt.Sprint(s.ports[0]), "--http-port", fmt.Sprint(s.ports[1]), "--metrics-port", fmt.Sprint(s.ports[2]),
		"--db-filename", s.db, "--log-level", "error"}
	if os.Getenv(EnvTemporalDefaults) != "1" {
		args = append(args, "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
			"--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
			"--dynamic-config-value", "system.enableActivityEagerExecution=true")
	}
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	// Its own process group. No parent-death signal: Go sends it when the
	// thread that started the server ends, not the test binary. A server
	// whose test binary was killed is stopped by the next one
	// (reapStaleTemporal).
	ownGroup(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting the Temporal dev server: %w", err)
	}
	os.WriteFile(filepath.Join(s.dir, "server"), []byte(ownerStamp(s.cmd.Process.Pid)), 0o600)
	done := s.done
	go func() { s.cmd.Wait(); close(done) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := s.ready(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("the Temporal dev server did not answer within 90s: %v\n%s", err, lastLines(s.out.String(), 20))
		}
		select {
		case <-done:
			return fmt.Errorf("the Temporal dev server exited: %s", lastLines(s.out.String(), 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// kill kills the server's process group at once (SIGKILL), as a crash.
func (s *devServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		signalGroup(s.cmd.Process.Pid, true)
		<-s.done
	}
}

// TemporalServer is a dev server of a test's own, which it may kill and
// start again: for the faults of the engine.
type TemporalServer struct{ s *devServer }

// StartTemporal starts a dev server for t alone (Temporal shares one), on
// free loopback ports with a database file of its own; it is stopped when
// t ends. It skips t (fails it when temporal is required) when the CLI is
// missing or the server does not start.
func StartTemporal(t testing.TB) *TemporalServer {
	t.Helper()
	s, err := startTemporal()
	if err != nil {
		Unavailable(t, "temporal", err.Error())
	}
	t.Cleanup(s.stop)
	return &TemporalServer{s: s}
}

// Addr returns the server's host:port.
func (ts *TemporalServer) Addr() string { return ts.s.addr }

// Kill kills the server at once (SIGKILL), as a crash.
func (ts *TemporalServer) Kill() { ts.s.kill() }

// Restart starts the killed server again on its address: with its
// database, or, fresh, with an empty one (a server that lost its data).
func (ts *TemporalServer) Restart(t testing.TB, fresh bool) {
	t.Helper()
	if fresh {
		ts.s.db = filepath.Join(ts.s.dir, fmt.Sprintf("temporal-%d.db", time.Now().UnixNano()))
	}
	if err := ts.s.start(); err != nil {
		t.Fatal(err)
	}
}

// ready reports whether the server answers a health check and has its
// default namespace.
func (s *devServer) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{HostPort: s.addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return err
	}
	_, err = c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"})
	return err
}

func (s *devServer) stop() {
	if s.cmd.Process != nil {
		signalGroup(s.cmd.Process.Pid, false)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			signalGroup(s.cmd.Process.Pid, true)
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

// reapStaleTemporal stops the dev servers that test binaries which are
// provably gone left running, and removes their directories. A server
// whose owner still runs, or cannot be read, is left alone.
func reapStaleTemporal() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "timebox-temporal-*"))
	for _, d := range dirs {
		owner, ok := readStamp(filepath.Join(d, "owner"))
		if !ok || processStart(owner.pid) == owner.start {
			continue // unreadable, or alive
		}
		if srv, ok := readStamp(filepath.Join(d, "server")); ok && processStart(srv.pid) == srv.start {
			signalGroup(srv.pid, true)
		}
		os.RemoveAll(d)
	}
}

type stamp struct {
	pid   int
	start string
}

func readStamp(path string) (stamp, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return stamp{}, false
	}
	var s stamp
	if n, _ := fmt.Sscan(string(b), &s.pid, &s.start); n != 2 || s.pid <= 0 {
		return stamp{}, false
	}
	return s, true
}
