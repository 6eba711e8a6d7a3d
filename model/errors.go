package model

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"
)

// httpDates are the date formats a Retry-After header may use (RFC 9110
// §5.6.7: the IMF-fixdate and the two obsolete forms).
var httpDates = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

// ParseRetryAfter reads a Retry-After header value — delay seconds or an
// HTTP date — as the wait it asks for from now. An empty, malformed or past
// value is 0.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil && n >= 0 {
		return time.Duration(n * float64(time.Second))
	}
	for _, f := range httpDates {
		if t, err := time.Parse(f, v); err == nil {
			return max(t.Sub(now), 0)
		}
	}
	return 0
}

// TransportError classifies a stream failure that is not an HTTP error
// status: a reply that could not be parsed is Malformed, anything else (a
// reset connection, an unexpected EOF) a plain provider failure. Both are
// LLM-phase failures that move along the failover chain.
func TransportError(provider string, err error) *Error {
	var se *json.SyntaxError
	if errors.As(err, &se) || strings.Contains(err.Error(), "invalid character") || strings.Contains(err.Error(), "unexpected end of JSON") {
		return &Error{Provider: provider, Malformed: true, Message: err.Error(), Err: err}
	}
	return &Error{Provider: provider, Message: err.Error(), Err: err}
}
