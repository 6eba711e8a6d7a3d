//go:build race

package floodtest

// Race is true when the race detector is on: every figure is then several
// times what it is in a normal build, the flooding program's included.
const Race = true
