//go:build darwin || linux

package server

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// maxVecs is the most buffers one writev takes (IOV_MAX).
const maxVecs = 1024

// nowWriter is how a pool's writer writes without waiting (write). It is
// kept from write to write, with the function handed to the socket made
// once: a fan-out to ten thousand followers allocated three times a
// follower for the closure and what it captured.
type nowWriter struct {
	bs  [][]byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

// write writes bs to raw's socket with one writev that does not wait: n
// is what the socket took, whole whether that was all of it. It writes
// nothing when raw is nil, its deadline has passed, or bs has more buffers
// than one writev takes; the caller then writes the rest as usual, and
// meets any error there.
func (v *nowWriter) write(raw syscall.RawConn, bs [][]byte) (n int, whole bool) {
	if raw == nil || len(bs) > maxVecs {
		return 0, false
	}
	if v.fn == nil {
		v.fn = v.writev
	}
	v.bs, v.n, v.err = bs, 0, nil
	err := raw.Write(v.fn)
	n, werr := v.n, v.err
	v.bs, v.err = nil, nil
	if err != nil || werr != nil || n < 0 {
		return 0, false
	}
	total := 0
	for _, b := range bs {
		total += len(b)
	}
	return n, n == total
}

// writev is handed to the socket: one writev, and never wait for the
// socket.
func (v *nowWriter) writev(fd uintptr) bool {
	v.n, v.err = unix.Writev(int(fd), v.bs)
	return true
}
