// Package testenv gives timebox's tests the real peers some of them need —
// npm packages (MCP servers), a Chromium, a PostgreSQL cluster and a
// Temporal dev server — or a clear reason to skip.
//
// On a fresh clone `go test ./...` passes: a test that needs an npm package
// installs it from the pinned lockfile (once; concurrent test binaries
// wait on a file lock), and skips, naming the command to run, when node or
// the registry is out of reach. CI makes the peers mandatory with
//
//	TB_TEST_REQUIRE=npm,chromium,postgres,temporal
//
// so that a missing peer fails the run instead of skipping it. Test
// switches start with TB_TEST_, never TIMEBOX_: the timebox binary warns
// about TIMEBOX_* variables it does not know.
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// EnvRequire lists, comma-separated, the peers whose absence fails a test
// instead of skipping it: npm, chromium, postgres, temporal.
const EnvRequire = "TB_TEST_REQUIRE"

// EnvChromium names the Chromium binary to use, when it is not on PATH
// under a usual name.
const EnvChromium = "TB_TEST_CHROMIUM"

// EnvBurstCalls sets the number of calls of tool/exectool's
// TestBurstOfHungHardCalls (default 200, which keeps it to a few seconds
// under -race); TB_TEST_BURST_CALLS=1000 is issue 9's burst. The fault
// suite (internal/faults) runs its own 1,000-call burst through the
// timebox binary.
const EnvBurstCalls = "TB_TEST_BURST_CALLS"

// Required reports whether the peer is listed in TB_TEST_REQUIRE.
func Required(peer string) bool {
	return slices.Contains(strings.Split(os.Getenv(EnvRequire), ","), peer)
}

// Unavailable skips t with why, or fails it when peer is required.
func Unavailable(t testing.TB, peer, why string) {
	t.Helper()
	if Required(peer) {
		t.Fatalf("%s (%s=%s makes this a failure)", why, EnvRequire, os.Getenv(EnvRequire))
	}
	t.Skip(why)
}

// npmInstallTimeout bounds one `npm ci`.
const npmInstallTimeout = 5 * time.Minute

// NPM makes sure the npm packages of dir (a package.json with its
// package-lock.json, relative to the test's package directory) are
// installed, installing them with `npm ci` when node_modules is missing,
// and returns dir's absolute path. It skips t (fails it when npm is
// required) when node or npm is missing or the install fails, saying
// which command to run.
func NPM(t testing.TB, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	install := "npm ci --prefix " + rel(abs)
	for _, prog := range []string{"node", "npm"} {
		if _, err := exec.LookPath(prog); err != nil {
			Unavailable(t, "npm", fmt.Sprintf("%s is not installed: these tests run real MCP servers from npm (install Node.js, then `%s`)", prog, install))
		}
	}
	if err := installOnce(abs); err != nil {
		Unavailable(t, "npm", fmt.Sprintf("the npm packages of %s are not installed and `%s` failed: %v", rel(abs), install, err))
	}
	return abs
}

// installOnce runs `npm ci` in dir unless its node_modules is complete.
// Test binaries of several packages may need it at once: they take an
// exclusive lock on a file in dir, and the first installs while the
// others wait and then find it done.
func installOnce(dir string) error {
	done := filepath.Join(dir, "node_modules", ".package-lock.json")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	unlock, err := lockFile(lock)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return nil // another test binary installed it while we waited
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmInstallTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLines(string(out), 5))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// rel returns p relative to the module root when it is inside it, for
// commands a person can paste at the root.
func rel(p string) string {
	dir := p
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if r, err := filepath.Rel(dir, p); err == nil {
				return r
			}
			return p
		}
		up := filepath.Dir(dir)
		if up == dir {
			return p
		}
		dir = up
	}
}

// Chromium returns the path of a Chromium (or Chrome) binary: TB_TEST_CHROMIUM,
// else the first usual name on PATH. It skips t (fails it when chromium is
// required) when there is none.
func Chromium(t testing.TB) string {
	t.Helper()
	names := []string{os.Getenv(EnvChromium), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}
	for _, n := range names {
		if n == "" {
			continue
		}
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	Unavailable(t, "chromium", fmt.Sprintf("no Chromium on PATH: the browser tests need one (apt-get install chromium, or set %s)", EnvChromium))
	return ""
}
