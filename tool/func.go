package tool

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
)

// Handler is the body of a Go-function tool. It receives the call's
// arguments as JSON and a Progress to report through, and returns the
// result: a string or []byte is used as is, anything else is sent as JSON.
// It must watch ctx: at the deadline ctx is cancelled, and a handler that
// has not returned after the kill grace is abandoned.
type Handler func(ctx context.Context, input json.RawMessage, p Progress) (any, error)

// Func is a tool implemented by a Go function. Its calls are cooperative by
// default (spec §3).
type Func struct {
	spec Spec
	fn   Handler
}

// NewFunc returns a Go-function tool. schema may be nil for "any object".
// A nil fn makes a tool that agent.New refuses (see Check).
func NewFunc(name, description string, schema json.RawMessage, fn Handler) *Func {
	return &Func{spec: Spec{Name: name, Description: description, InputSchema: schema}, fn: fn}
}

// Typed returns a Go-function tool whose input is decoded into In and whose
// input schema is inferred from In (JSON field tags; a `jsonschema` tag is
// the field's description). It panics if In's schema cannot be inferred,
// which is a programming error. A nil fn makes a tool that agent.New
// refuses, as NewFunc's does. In should be a struct (or a pointer to
// one, or a map): a tool's arguments are always a JSON object, and
// agent.New refuses a tool whose input is anything else.
func Typed[In, Out any](name, description string, fn func(ctx context.Context, in In, p Progress) (Out, error)) *Func {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: %v", name, err))
	}
	if slices.Equal(s.Types, []string{"null", "object"}) {
		// A pointer In: the arguments are an object, never null.
		s.Types, s.Type = nil, "object"
	}
	raw, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("tool %s: %v", name, err))
	}
	if fn == nil {
		return NewFunc(name, description, raw, nil)
	}
	return NewFunc(name, description, raw, func(ctx context.Context, input json.RawMessage, p Progress) (any, error) {
		var in In
		if err := json.Unmarshal(input, &in); err != nil {
			return nil, &Error{Message: "decoding arguments: " + err.Error()}
		}
		return fn(ctx, in, p)
	})
}

// Spec returns the tool's spec.
func (f *Func) Spec() Spec { return f.spec }

// Kind returns KindGo.
func (f *Func) Kind() Kind { return KindGo }

// Check returns an error when no call of f can run: it was made without
// a function (NewFunc or Typed given nil). agent.New refuses such a tool
// with this error, so that the mistake shows when the agent is built, not
// when the model first calls the tool.
func (f *Func) Check() error {
	if f.fn == nil {
		return &Error{Message: "the tool has no function (tool.NewFunc or tool.Typed was given nil)"}
	}
	return nil
}

// Call runs the function.
func (f *Func) Call(ctx context.Context, c *Call) (*Result, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	v, err := f.fn(ctx, c.Input, c.Progress)
	var out []byte
	switch v := v.(type) {
	case nil:
	case string:
		out = []byte(v)
	case []byte:
		out = v
	default:
		b, merr := json.Marshal(v)
		if merr != nil && err == nil {
			err = &Error{Message: "encoding result: " + merr.Error()}
		}
		out = b
	}
	if err != nil {
		if ctx.Err() != nil {
			return &Result{Output: out}, err
		}
		if _, ok := err.(*Error); !ok {
			err = &Error{Message: err.Error()}
		}
	}
	return &Result{Output: out}, err
}
