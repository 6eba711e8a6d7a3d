// Package benchprof profiles one phase of a benchmark — the wind-down of
// 10,000 turns, the stops of a burst — rather than the whole run, whose
// setup would drown it.
package benchprof

import (
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
)

// Env names the file prefix the profiles are written to; unset, Phase does
// nothing.
const Env = "TB_BENCH_PROFILE"

// Phase starts profiling a phase when $TB_BENCH_PROFILE is set: a CPU
// profile to PREFIX+name+".cpu", and the allocation profile now and when
// the returned stop is called, to ".allocs0" and ".allocs1", to read with
// go tool pprof -sample_index=alloc_space -base PREFIX.allocs0 PREFIX.allocs1.
func Phase(tb testing.TB, name string) (stop func()) {
	prefix := os.Getenv(Env)
	if prefix == "" {
		return func() {}
	}
	prefix += name
	allocs := func(suffix string) {
		runtime.GC() // the profile is as of the last GC
		f, err := os.Create(prefix + suffix)
		if err != nil {
			tb.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			tb.Fatal(err)
		}
	}
	allocs(".allocs0")
	f, err := os.Create(prefix + ".cpu")
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		allocs(".allocs1")
	}
}
