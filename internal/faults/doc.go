// Package faults is timebox's fault suite, the end-to-end layer of issue
// 9's promise — that every budget is honest and enforced and that nothing
// a turn started outlives it — at the edges: model streams that never end,
// floods of output and of progress, process trees that try to escape, a
// burst of a thousand calls, 10,000 turns stopped at one instant, clients
// that go away, signals and crashes in the middle of a turn (TestFaults);
// the Temporal engine's workers and server killed (TestEngineFaults); and
// the stores under outages — a PostgreSQL stopped, restarted, locked or
// cutting connections under several gateways, a SQLite file locked by
// another process (TestStoreFaults).
//
// Each scenario runs the real `timebox` binary (built once by the suite)
// or, where a binary adds nothing, the library, and asserts its figures
// with generous bounds: processes left (always 0: a marker scan and the
// call cgroups), goroutines back to their baseline (in-process scenarios),
// records lost (0: every call that started has a record, and the stored
// turn matches what was emitted), the peak memory of the timebox process
// (its VmHWM), and the time past the deadline; the store's scenarios add
// events lost, healthy turns interrupted and the time from the database's
// return to the turn's stored end.
//
// The tests are behind the build tag faults, so that `go test ./...` stays
// quick; CI runs them as a step of their own:
//
//	go test -tags faults -count=1 ./internal/faults/
//	go test -tags faults -count=1 ./internal/faults/ -faults.report=figures.md   # the measured table
//
// The unit tests of each package stay where they are; this suite is the
// layer above them. docs/RELIABILITY.md has the table of a real run, what
// each scenario proves, and the command that reproduces it.
package faults
