package cli

// watchReader does nothing on Windows, which cannot poll a pipe's write end
// for its reader: a reader that went away is found by the next write
// (goneWriter), as for a terminal or a file.
func watchReader(out any, gone func()) (stop func()) { return func() {} }
