//go:build linux

package exectool_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// helperArg, as the first argument, makes the test binary a tool program
// instead of running tests: TestMain checks it before the testing flags are
// parsed. An argument rather than an environment variable, so that the
// environment allowlist tests cannot turn a helper back into a test run.
const helperArg = "exectool-helper"

// helper runs one helper mode and returns the exit status.
func helper(args []string) int {
	mode, args := args[0], args[1:]
	out, errw := os.Stdout, os.Stderr
	switch mode {
	case "plain":
		fmt.Fprint(out, "hello, world\n")
	case "json":
		fmt.Fprint(out, `{"ok": true, "n": 3}`)
	case "echo-stdin":
		io.Copy(out, os.Stdin)
	case "progress":
		fmt.Fprintln(errw, `::progress:: {"progress": 1, "total": 3, "message": "one"}`)
		fmt.Fprintln(errw, "log line a")
		fmt.Fprintln(errw, `::progress:: {"progress": 2, "total": 3}`)
		fmt.Fprintln(errw, `::progress::`)
		fmt.Fprintln(errw, `::progress:: fetching page 3`)
		fmt.Fprintln(errw, `::progress:: {"progress": "two", oops`)
		fmt.Fprint(errw, "log line b")
		fmt.Fprint(out, "done")
	case "fail":
		fmt.Fprint(out, "partial")
		fmt.Fprintln(errw, "starting")
		fmt.Fprintln(errw, "boom: connection refused")
		return 3
	case "sigkill":
		fmt.Fprintln(errw, "about to die")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case "big":
		n, _ := strconv.Atoi(args[0])
		chunk := []byte(strings.Repeat("x", 64<<10))
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := out.Write(chunk[:k]); err != nil {
				return 1
			}
			n -= k
		}
	case "env":
		fmt.Fprint(out, strings.Join(os.Environ(), "\n"))
	case "whoami":
		fmt.Fprintf(out, "uid=%d gid=%d HOME=%s USER=%s", os.Getuid(), os.Getgid(), os.Getenv("HOME"), os.Getenv("USER"))
	case "pwd":
		wd, _ := os.Getwd()
		fmt.Fprint(out, wd)
	case "nonutf8":
		out.Write([]byte("ok \xff\xfe\xfd end"))
		errw.Write([]byte("bad \xc3\x28 bytes\n\xff\xff last \xe2\x82\n"))
		return 1
	case "hang":
		fmt.Fprint(out, "partial")
		fmt.Fprintln(errw, "::progress:: ready")
		time.Sleep(time.Hour)
	case "hang-quiet":
		time.Sleep(time.Hour)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprint(out, "partial")
		fmt.Fprintln(errw, "::progress:: ready")
		time.Sleep(time.Hour)
	case "setsid":
		// A child that starts its own session, leaving the process group.
		pid := spawn(exec.Command(self(), helperArg, "hang-quiet"), &syscall.SysProcAttr{Setsid: true}, nil)
		fmt.Fprintf(out, "child %d\n", pid)
		fmt.Fprintln(errw, "::progress:: ready")
		time.Sleep(time.Hour)
	case "clear-env-escape":
		// A child that both clears its environment (no marker) and starts
		// its own session: only a cgroup can find it.
		c := exec.Command(self(), helperArg, "hang-quiet")
		c.Env = []string{}
		pid := spawn(c, &syscall.SysProcAttr{Setsid: true}, nil)
		fmt.Fprintf(out, "child %d\n", pid)
		fmt.Fprintln(errw, "::progress:: ready")
		time.Sleep(time.Hour)
	case "daemon":
		// The classic double fork: a middle process starts the daemon in
		// a new session and exits at once, so the daemon's parent is gone.
		c := exec.Command(self(), helperArg, "daemon-middle")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		b, err := c.Output()
		if err != nil {
			fmt.Fprintln(errw, "middle:", err)
			return 1
		}
		fmt.Fprintf(out, "child %s\n", strings.TrimSpace(string(b)))
		fmt.Fprintln(errw, "::progress:: ready")
		if len(args) > 0 && args[0] == "exit" {
			return 0
		}
		time.Sleep(time.Hour)
	case "daemon-middle":
		pid := spawn(exec.Command(self(), helperArg, "hang-quiet"), &syscall.SysProcAttr{Setsid: true}, nil)
		fmt.Fprintln(out, pid)
		return 0
	case "bg-stdout":
		// A background child that keeps stdout open after its parent exits.
		pid := spawn(exec.Command(self(), helperArg, "hang-quiet"), nil, os.Stdout)
		fmt.Fprintf(out, "child %d\n", pid)
		return 0
	default:
		fmt.Fprintln(errw, "unknown helper mode", mode)
		return 2
	}
	return 0
}

// spawn starts c without waiting for it and returns its pid.
func spawn(c *exec.Cmd, attr *syscall.SysProcAttr, stdout *os.File) int {
	c.SysProcAttr = attr
	if stdout != nil {
		c.Stdout = stdout
	}
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "spawn:", err)
		os.Exit(1)
	}
	return c.Process.Pid
}

func self() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}
