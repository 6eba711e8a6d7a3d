package testenv

import (
	"context"
	"net"
	"sync"
	"testing"
)

// Serve runs serve (a server's Serve method, such as server.Server's) on a
// new listener on a free loopback port, in a goroutine, and returns the
// listener's URL ("http://127.0.0.1:port") and stop, which cancels serve's
// context, waits for serve to return and returns what it returned. stop is
// idempotent (later calls return the first one's error) and safe for
// concurrent use. When the test ends stop is called, and an error it
// returns fails the test; a caller that calls stop itself orders its own
// cleanups around it.
func Serve(t testing.TB, serve func(context.Context, net.Listener) error) (url string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	stop = sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), stop
}
