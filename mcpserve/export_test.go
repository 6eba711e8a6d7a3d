package mcpserve

// SetMaxLine sets the longest line Stdio reads, and returns what undoes it.
func SetMaxLine(n int) (undo func()) {
	old := maxLine
	maxLine = n
	return func() { maxLine = old }
}
