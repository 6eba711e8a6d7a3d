//go:build !windows

package cli

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// watchReader calls gone once when the reader of out, a pipe, goes away
// (`timebox run … | grep -m1 tool_started` after grep matched), without
// waiting for timebox's next write to fail with EPIPE: a turn whose tool
// is silent has nothing to write for minutes, and its tools would run on
// for nobody until then. Linux reports POLLERR on a pipe's write end once
// it has no reader left; nothing else is asked of poll, so a full pipe
// does not wake it. out that is not a pipe (a terminal, a file, a socket,
// whose peer may have closed only its own side) is left to goneWriter's
// EPIPE. stop ends the watch and returns once it has.
func watchReader(out any, gone func()) (stop func()) {
	f, ok := out.(*os.File)
	if !ok {
		return func() {}
	}
	// The descriptor is read through Control so that the file is not put
	// into blocking mode (File.Fd would); standard output stays open for
	// the life of the process, so the number stays valid after it.
	rc, err := f.SyscallConn()
	if err != nil {
		return func() {}
	}
	fd := -1
	rc.Control(func(u uintptr) { fd = int(u) })
	var st unix.Stat_t
	if fd < 0 || unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return func() {}
	}
	// stop wakes the poll through a pipe of its own.
	wake, wakeW, err := os.Pipe()
	if err != nil {
		return func() {}
	}
	wrc, err := wake.SyscallConn()
	if err != nil {
		wake.Close()
		wakeW.Close()
		return func() {}
	}
	wfd := -1
	wrc.Control(func(u uintptr) { wfd = int(u) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		fds := []unix.PollFd{{Fd: int32(fd)}, {Fd: int32(wfd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
				gone()
				return
			}
		}
	}()
	return func() {
		wakeW.Close()
		<-done
		wake.Close()
	}
}
