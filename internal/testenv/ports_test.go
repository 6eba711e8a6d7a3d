package testenv

import (
	"errors"
	"testing"
)

// TestOnFreePortsTriesAgainWithNewPorts: a server that could not bind
// its ports is started again on others, three tries in all.
func TestOnFreePortsTriesAgainWithNewPorts(t *testing.T) {
	inUse := errors.New("bind: address already in use")
	var seen [][]int
	err := onFreePorts(3, func(ports []int) error {
		seen = append(seen, append([]int(nil), ports...))
		if len(seen) == 1 {
			return inUse
		}
		return nil
	})
	if err != nil || len(seen) != 2 {
		t.Fatalf("onFreePorts = %v after %d tries, want nil after 2", err, len(seen))
	}
	for _, ports := range seen {
		if len(ports) != 3 || ports[0] == 0 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
			t.Fatalf("ports %v: want three distinct free ports", ports)
		}
	}

	tries := 0
	err = onFreePorts(1, func([]int) error { tries++; return inUse })
	if !errors.Is(err, inUse) || tries != 3 {
		t.Fatalf("onFreePorts = %v after %d tries, want the last error after 3", err, tries)
	}
}
