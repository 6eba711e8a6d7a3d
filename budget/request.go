package budget

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/timebox-run/timebox/internal/exactjson"
	"github.com/timebox-run/timebox/internal/problem"
)

// Request holds the budgets one turn's caller asks for, by knob name
// ("turn", "tool", "max_steps") to the value as the agent file writes it
// ("90s", "5"). Only knobs with Request set may appear. Its JSON form is an
// object whose values are strings, or numbers for counts, each name once.
type Request map[string]string

// UnmarshalJSON reads {"turn": "10m", "max_steps": 5}: one JSON object,
// each name at most once (exactjson.Object). null, by encoding/json's
// convention, leaves r as it is.
func (r *Request) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	fields, err := exactjson.Object(b, nil)
	if err != nil {
		return fmt.Errorf("budgets: %w", err)
	}
	out := make(Request, len(fields))
	for k, v := range fields {
		v = bytes.TrimSpace(v)
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			var n json.Number
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf("budgets.%s: want a string such as \"90s\" or a number, got %s", k, v)
			}
			s = n.String()
		}
		out[k] = s
	}
	*r = out
	return nil
}

// RequestKnob returns the knob text of a value a request set: "budgets.turn
// in the request".
func RequestKnob(name string) string { return "budgets." + name + " in the request" }

// RequestError is a request's budget that was refused: not one a request
// may set, not a valid value, or over its ceiling. Ceiling is empty unless
// the value was over it.
type RequestError struct {
	// Name is the knob's short name, "turn".
	Name string
	// Asked is the value as the request wrote it.
	Asked string
	// Ceiling is the largest value the request could have asked for, as
	// the agent file writes it, when Asked was over it.
	Ceiling string
	// Msg says what is wrong and what the request may ask instead.
	Msg string
}

// Error returns "budgets.NAME: " and Msg.
func (e *RequestError) Error() string { return "budgets." + e.Name + ": " + e.Msg }

// Apply returns b and l with the values r asks for, each with source
// "request". A request may lower any budget it may set; it may raise one
// only up to max[name] (server.request_max; values in the knob's unit),
// and never turn one off (docs/decisions/request-budgets.md). A tool
// default is also bounded by timeouts.tool_max. It returns the first
// problem, by name, as a *RequestError and leaves b and l alone then.
func (r Request) Apply(b Budgets, l Limits, max map[string]int64) (Budgets, Limits, error) {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	nb, nl := b, l
	for _, name := range names {
		asked := strings.TrimSpace(r[name])
		k, ok := KnobByName(name)
		if !ok || !k.Request {
			return b, l, &RequestError{Name: name, Asked: asked,
				Msg: "not a budget a request may set" + problem.DidYouMean(name, RequestNames()) + "; it may set " + strings.Join(RequestNames(), ", ")}
		}
		n, problem := k.parse(asked)
		if problem != "" {
			return b, l, &RequestError{Name: name, Asked: asked, Msg: problem}
		}
		ceiling, capKnob, unbounded := k.Ceiling(&b, &l, max)
		if !unbounded && n > ceiling {
			e := &RequestError{Name: name, Asked: asked, Ceiling: k.Format(ceiling)}
			if capKnob != "" {
				e.Msg = fmt.Sprintf("%s is over the ceiling of %s (%s); ask for at most %s", asked, e.Ceiling, capKnob, e.Ceiling)
			} else {
				e.Msg = fmt.Sprintf("%s is over this agent's %s of %s, which a request may lower but not raise; ask for at most %s (an operator can allow more with server.request_max.%s)",
					asked, k.Key, e.Ceiling, e.Ceiling, name)
			}
			return b, l, e
		}
		if k.Key == KeyTool && !b.ToolMax.Off() && time.Duration(n) > b.ToolMax.D {
			c := FormatDuration(b.ToolMax.D)
			return b, l, &RequestError{Name: name, Asked: asked, Ceiling: c,
				Msg: fmt.Sprintf("%s is over %s, the largest timeout any tool may have (%s); ask for at most %s", asked, c, b.ToolMax.Knob, c)}
		}
		k.Set(&nb, &nl, n, SourceRequest, RequestKnob(name))
	}
	return nb, nl, nil
}

// Ceiling returns the most one request may ask of the knob: the resolved
// value in b or l, or max[k.Name] (server.request_max) when that is larger,
// with capKnob naming server.request_max then. unbounded is true when the
// budget is off: any value a request gives can only make it shorter.
func (k Knob) Ceiling(b *Budgets, l *Limits, max map[string]int64) (ceiling int64, capKnob string, unbounded bool) {
	cur, _, _ := k.Get(b, l)
	if cur == 0 && k.CanBeOff {
		return 0, "", true
	}
	if m, ok := max[k.Name]; ok && m > cur {
		return m, "server.request_max." + k.Name, false
	}
	return cur, "", false
}

// RequestNames returns the names of the knobs a request may set, in table
// order.
func RequestNames() []string {
	var out []string
	for _, k := range Knobs {
		if k.Request {
			out = append(out, k.Name)
		}
	}
	return out
}

// parse reads a value of the knob as a request writes it and checks its
// bounds. A request cannot turn a budget off, so zero is refused.
func (k Knob) parse(v string) (int64, string) {
	var n int64
	switch k.Kind {
	case KindDuration:
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Sprintf("%q is not a duration (use Go syntax such as 90s, 10m or 1h30m)", v)
		}
		n = int64(d)
	default:
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Sprintf("%q is not a whole number", v)
		}
		n = c
	}
	if n <= 0 {
		return 0, fmt.Sprintf("%s must be more than 0: a request may lower a budget but not turn it off", v)
	}
	if p := k.Check(n); p != "" {
		return 0, p
	}
	return n, ""
}
