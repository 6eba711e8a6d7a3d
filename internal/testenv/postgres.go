package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// EnvPostgresDurable, set to 1, keeps fsync on in the throwaway cluster
// (for benchmarks whose figures should include it); tests run without it.
const EnvPostgresDurable = "TB_TEST_PG_DURABLE"

// Postgres returns the URL of a new, empty database for t on a throwaway
// PostgreSQL cluster, dropped when t ends. The cluster is started from
// Debian's postgresql package (initdb and pg_ctl in /usr/lib/postgresql/*/bin,
// or on PATH) at the first call, in a temporary directory, on a free
// loopback port, and serves the whole test binary: call StopPostgres from
// TestMain. Running as root, the cluster runs as the postgres user. It
// skips t (fails it when postgres is required) when the package is not
// installed or the cluster does not start.
func Postgres(t testing.TB) string {
	t.Helper()
	c, err := startCluster()
	if err != nil {
		Unavailable(t, "postgres", err.Error())
	}
	name := fmt.Sprintf("tb_%d_%d", os.Getpid(), c.dbs.Add(1))
	if err := c.psql("CREATE DATABASE " + name); err != nil {
		t.Fatalf("creating a test database: %v", err)
	}
	t.Cleanup(func() {
		// FORCE: a store a failed test left open must not keep it.
		if err := c.psql("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("dropping the test database: %v", err)
		}
	})
	return c.url(name)
}

// StopPostgres stops the cluster Postgres started, if any, and removes its
// directory. Call it from TestMain after the tests.
func StopPostgres() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if cluster != nil {
		cluster.stop()
		cluster = nil
	}
}

type pgCluster struct {
	bin    string // the directory of initdb, pg_ctl, psql
	dir    string // the cluster's temporary directory
	port   int
	asUser string // run the server as this user ("" = as we are)
	opts   string // the server's settings
	dbs    atomic.Int64
}

var (
	clusterMu  sync.Mutex
	cluster    *pgCluster
	clusterErr error
)

func startCluster() (*pgCluster, error) {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if cluster != nil || clusterErr != nil {
		return cluster, clusterErr
	}
	cluster, clusterErr = newCluster()
	return cluster, clusterErr
}

// pgBin finds the directory of PostgreSQL's server programs.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL is not installed: these tests run a throwaway cluster (apt-get install postgresql)")
}

func pgVersion(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func newCluster() (*pgCluster, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	c := &pgCluster{bin: bin}
	var uid, gid = -1, -1
	if os.Geteuid() == 0 {
		// The server refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, the test cluster runs as the postgres user, which does not exist: %v", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.asUser = "postgres"
	}
	reapStaleClusters(c)
	c.dir, err = os.MkdirTemp("", "timebox-pg-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "owner"), []byte(ownerStamp(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if uid >= 0 {
		if err := os.Chown(c.dir, uid, gid); err != nil {
			os.RemoveAll(c.dir)
			return nil, err
		}
	}
	if out, err := c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
		"--no-sync", "--no-instructions"); err != nil {
		os.RemoveAll(c.dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, lastLines(out, 5))
	}
	c.opts = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	if os.Getenv(EnvPostgresDurable) == "1" {
		c.opts = "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	}
	if err = onFreePorts(1, func(ports []int) error {
		c.port = ports[0]
		return c.start()
	}); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// start starts the cluster's server on its port.
func (c *pgCluster) start() error {
	out, err := c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "-o", c.serverOptions(), "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s %s", err, lastLines(out, 3), lastLines(readFile(filepath.Join(c.dir, "server.log")), 12))
	}
	return nil
}

// serverOptions are the server's settings: on loopback, on its port,
// with its socket in its directory.
func (c *pgCluster) serverOptions() string {
	return fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s %s -c max_connections=300 -c shared_buffers=32MB", c.port, c.dir, c.opts)
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }

func (c *pgCluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// run runs one of the server programs, as the cluster's user.
func (c *pgCluster) run(prog string, args ...string) (string, error) {
	path := filepath.Join(c.bin, prog)
	var cmd *exec.Cmd
	if c.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// psql runs one SQL statement in the cluster's postgres database.
func (c *pgCluster) psql(sql string) error {
	cmd := exec.Command(filepath.Join(c.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
		"-p", strconv.Itoa(c.port), "-U", "postgres", "-d", "postgres", "-c", sql)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("psql -c %q: %v: %s", sql, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (c *pgCluster) stop() {
	if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
		c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "-t", "30", "stop")
	}
	os.RemoveAll(c.dir)
}

// onFreePorts calls start with n free loopback ports, and again with new
// ones while it fails, three tries in all: a free port can be taken
// between our look and the server's bind (by a connection's own port, or
// by the server's other listeners).
func onFreePorts(n int, start func(ports []int) error) error {
	var err error
	for range 3 {
		var ports []int
		if ports, err = freePorts(n); err != nil {
			return err
		}
		if err = start(ports); err == nil {
			return nil
		}
	}
	return err
}

// freePorts returns n distinct free loopback ports: each is held until
// all are chosen.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// ownerStamp names a process for good: its pid and start time (a pid is
// reused, a pid and start time are not).
func ownerStamp(pid int) string {
	return fmt.Sprintf("%d %s", pid, processStart(pid))
}

// processStart returns the start time of process pid in clock ticks since
// boot (field 22 of /proc/PID/stat), or "" when there is no such process.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// reapStaleClusters stops and removes the clusters that test binaries
// which are provably gone (killed by a timeout, say) left in the temporary
// directory. A cluster whose owner still runs, or whose owner cannot be
// read, is left alone.
func reapStaleClusters(c *pgCluster) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "timebox-pg-*"))
	for _, d := range dirs {
		stamp, err := os.ReadFile(filepath.Join(d, "owner"))
		if err != nil {
			continue
		}
		var pid int
		var start string
		if n, _ := fmt.Sscan(string(stamp), &pid, &start); n != 2 || pid <= 0 {
			continue
		}
		if processStart(pid) == start {
			continue // alive
		}
		stale := &pgCluster{bin: c.bin, dir: d, asUser: c.asUser}
		stale.stop()
	}
}

// PostgresServer is a throwaway PostgreSQL cluster of one test's own, for
// the tests of what the stores do when the database goes away: the test
// stops it, starts it again, restarts it. Its databases are gone with it
// when the test ends.
type PostgresServer struct {
	t testing.TB
	c *pgCluster
}

// StartPostgres starts a cluster for t alone (as Postgres does for the
// whole binary), stopped and removed when t ends. It skips t (fails it
// when postgres is required) when PostgreSQL is not installed.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	c, err := newCluster()
	if err != nil {
		Unavailable(t, "postgres", err.Error())
	}
	t.Cleanup(c.stop)
	return &PostgresServer{t: t, c: c}
}

// Database creates a new, empty database and returns its URL.
func (s *PostgresServer) Database() string {
	s.t.Helper()
	name := fmt.Sprintf("tb_%d", s.c.dbs.Add(1))
	if err := s.c.psql("CREATE DATABASE " + name); err != nil {
		s.t.Fatalf("creating a test database: %v", err)
	}
	return s.c.url(name)
}

// Stop stops the server the way an administrator does (pg_ctl stop -m
// fast: the clients' connections are cut, the server is down until
// Start).
func (s *PostgresServer) Stop() {
	s.t.Helper()
	if out, err := s.c.run("pg_ctl", "-D", s.c.data(), "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		s.t.Fatalf("pg_ctl stop: %v: %s", err, lastLines(out, 3))
	}
}

// Start starts the stopped server again, on the same port.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if err := s.c.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Restart restarts the server (pg_ctl restart -m fast): the clients'
// connections are cut and it is back a moment later.
func (s *PostgresServer) Restart() {
	s.t.Helper()
	if out, err := s.c.run("pg_ctl", "-D", s.c.data(), "-l", filepath.Join(s.c.dir, "server.log"), "-m", "fast", "-w", "-t", "60",
		"-o", s.c.serverOptions(), "restart"); err != nil {
		s.t.Fatalf("pg_ctl restart: %v: %s", err, lastLines(out, 3))
	}
}

// Exec runs one SQL statement in the cluster's postgres database.
func (s *PostgresServer) Exec(sql string) error { return s.c.psql(sql) }
