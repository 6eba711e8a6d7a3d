//go:build !(darwin || linux)

package server

import "syscall"

// nowWriter writes nothing here: every write of a woken stream is made by
// a goroutine of its own (writers.go), as before the pool.
type nowWriter struct{}

func (*nowWriter) write(raw syscall.RawConn, bs [][]byte) (n int, whole bool) { return 0, false }
