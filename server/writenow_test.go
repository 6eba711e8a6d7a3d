//go:build darwin || linux

package server

import (
	"net"
	"testing"
)

// TestWriteNowAllocatesNothing: a pooled writer's write that does not wait
// allocates nothing — it allocated three times a follower and event in a
// fan-out to ten thousand (the closure handed to the socket and what it
// captured) — and writes what it is given.
func TestWriteNowAllocatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, buf := 0, make([]byte, 1<<16)
		for {
			m, err := c.Read(buf)
			n += m
			if err != nil {
				got <- n
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	bs := [][]byte{[]byte("id: 1\nevent: x\ndata: "), []byte(`{"a":1}`), []byte("\n\n")}
	size := len(bs[0]) + len(bs[1]) + len(bs[2])
	var w nowWriter
	writes := 0
	allocs := testing.AllocsPerRun(100, func() {
		if n, whole := w.write(raw, bs); !whole || n != size {
			t.Fatalf("wrote %d of %d bytes", n, size)
		}
		writes++
	})
	c.Close()
	if allocs != 0 {
		t.Errorf("%v allocations a write, want 0", allocs)
	}
	if n := <-got; n != writes*size {
		t.Errorf("the peer read %d bytes, want %d", n, writes*size)
	}
}
