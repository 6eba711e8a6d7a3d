// Package silentconns closes, when an HTTP server stops, the connections
// on which no request has come: http.Server.Shutdown waits for such a
// connection until it is 5s old, and a client's spare one (an MCP
// client's, dialled for a request another connection took; a browser's
// preconnect) held a stop that long. A request that came on one then
// would only be refused. timebox serve and timebox mcp serve --addr use
// it.
package silentconns

import (
	"net"
	"net/http"
	"sync"
)

// Set tracks a server's connections on which no request has come yet.
// Its zero value is not usable: use New.
type Set struct {
	mu       sync.Mutex
	fresh    map[net.Conn]struct{}
	stopping bool
}

// New returns an empty Set; give its State to the server's ConnState.
func New() *Set { return &Set{fresh: map[net.Conn]struct{}{}} }

// State is the server's ConnState hook.
func (s *Set) State(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case st != http.StateNew:
		delete(s.fresh, c)
	case s.stopping: // accepted before the listener closed
		c.Close()
	default:
		s.fresh[c] = struct{}{}
	}
}

// Stop closes the silent connections, and each accepted from now on.
// Call it as the server's Shutdown begins.
func (s *Set) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	for c := range s.fresh {
		c.Close()
	}
	clear(s.fresh)
}
