package exectool

import (
	"bytes"
	"fmt"
	"testing"
)

// logChunk is 16 KiB of 128-byte log lines, as a program logging a
// gigabyte writes them.
var logChunk = bytes.Repeat(fmt.Appendf(nil, "%-127s\n", "log line 1: all work and no play makes jack a dull boy"), 128)

// TestLogLinesCostNoAllocation: reading a program's log allocates nothing
// per line. A string per line (the last line, made text at once) made
// timebox read 1 GiB of stderr at a third of the speed the program wrote
// it (the fault suite's "1 GiB stderr"); the last line is made text only
// when it is asked for.
func TestLogLinesCostNoAllocation(t *testing.T) {
	s := &stderrLog{}
	s.write(logChunk) // the buffers grow once
	if n := testing.AllocsPerRun(20, func() { s.write(logChunk) }); n > 0 {
		t.Errorf("%.0f allocations per %d lines of log", n, bytes.Count(logChunk, []byte("\n")))
	}
	if got := s.lastLine(); got != "log line 1: all work and no play makes jack a dull boy" {
		t.Errorf("last line %q", got)
	}
}

// BenchmarkStderrLog is the speed at which a program's log is read.
func BenchmarkStderrLog(b *testing.B) {
	s := &stderrLog{}
	b.SetBytes(int64(len(logChunk)))
	b.ReportAllocs()
	for b.Loop() {
		s.write(logChunk)
	}
}
