//go:build linux

package proctree

import "testing"

// BenchmarkScan measures one shared /proc scan of the tracking strategy on
// this machine, for a call with no processes: the fixed cost each stop and
// each normal end of a tracked call pays once (docs/BENCHMARKS.md).
func BenchmarkScan(b *testing.B) {
	pgids := map[int]uint64{-5: 1 << 62}
	wanted := map[uint64]bool{1 << 62: true}
	for b.Loop() {
		scan(pgids, wanted)
	}
}
