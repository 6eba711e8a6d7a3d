//go:build !linux

package sqlite

import "os"

// machineID names the pid space this process lives in. Without /proc the
// host name is all there is, and pids are never trusted (processAlive):
// owners are judged by their heartbeats alone.
func machineID() string {
	host, _ := os.Hostname()
	return host
}

// processStart is unknown without /proc.
func processStart(int) (string, bool) { return "", false }

// processAlive cannot tell without /proc; the heartbeat decides.
func processAlive(int, string) (alive, known bool) { return false, false }
