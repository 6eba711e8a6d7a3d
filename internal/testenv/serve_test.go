package testenv

import (
	"context"
	"net"
	"net/http"
	"testing"

	"go.uber.org/goleak"
)

// TestServe: the server runs on loopback until stop, which cancels its
// context and returns what serve returned, once; a second stop returns at
// once. Nothing of it is left running.
func TestServe(t *testing.T) {
	defer goleak.VerifyNone(t)
	var cause error
	url, stop := Serve(t, func(ctx context.Context, ln net.Listener) error {
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })}
		go func() { <-ctx.Done(); hs.Close() }()
		if err := hs.Serve(ln); err != http.ErrServerClosed {
			return err
		}
		cause = ctx.Err()
		return nil
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := stop(); err != nil || cause != context.Canceled {
		t.Fatalf("stop = %v, serve's context %v; want nil, cancelled", err, cause)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop again = %v", err)
	}
}
