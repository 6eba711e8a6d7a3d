//go:build darwin || linux

package server

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// maxVecs is the most buffers one writev takes (IOV_MAX).
const maxVecs = 1024

// writeNow writes bs to raw's socket with one writev that does not wait:
// n is what the socket took, whole whether that was all of it. It writes
// nothing when raw is nil, its deadline has passed, or bs has more buffers
// than one writev takes; the caller then writes the rest as usual, and
// meets any error there.
func writeNow(raw syscall.RawConn, bs [][]byte) (n int, whole bool) {
	if raw == nil || len(bs) > maxVecs {
		return 0, false
	}
	var werr error
	err := raw.Write(func(fd uintptr) bool {
		n, werr = unix.Writev(int(fd), bs)
		return true // never wait for the socket
	})
	if err != nil || werr != nil || n < 0 {
		return 0, false
	}
	total := 0
	for _, b := range bs {
		total += len(b)
	}
	return n, n == total
}
