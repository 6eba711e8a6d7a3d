package tool

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// asError is an error that says, through an As method, that it is a tool's
// own failure.
type asError struct{}

func (asError) Error() string { return "as" }
func (asError) As(target any) bool {
	if p, ok := target.(**Error); ok {
		*p = &Error{Message: "as"}
		return true
	}
	return false
}

// isOwnError tells a tool's own failure from its report of having been
// stopped, as errors.As does, down any chain.
func TestIsOwnError(t *testing.T) {
	own := &Error{Message: "exit 1"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"its own", own, true},
		{"wrapped", fmt.Errorf("call: %w", fmt.Errorf("run: %w", own)), true},
		{"joined", errors.Join(context.Canceled, own), true},
		{"wrapped, then joined", fmt.Errorf("x: %w", errors.Join(errors.New("a"), own)), true},
		{"an As method", fmt.Errorf("x: %w", asError{}), true},
		{"stopped", context.Canceled, false},
		{"stopped, wrapped", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"joined, none its own", errors.Join(context.Canceled, errors.New("b")), false},
	} {
		var te *Error
		if got := isOwnError(c.err); got != c.want || got != errors.As(c.err, &te) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { isOwnError(context.Canceled) }); n != 0 {
		t.Errorf("%v allocations for a stopped call's error, want 0", n)
	}
}
