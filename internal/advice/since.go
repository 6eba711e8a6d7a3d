package advice

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseSince reads how far back the calls of a report go, as `timebox
// stats --since` and GET /v1/stats?since= take it: a duration back from
// now (Go's syntax, or whole days: 7d), a date or a time (RFC 3339), or 0
// or "all" for all time (the zero time). The error says what to give. A
// date or time after now is refused: it selects nothing, and one past 2262
// is beyond what a store's nanosecond clock counts.
func ParseSince(s string, now time.Time) (time.Time, error) {
	t, err := parseSince(s, now)
	if err == nil && t.After(now) {
		return time.Time{}, fmt.Errorf("%s is in the future: give a date or time before now (%s), or how far back (7d)", strings.TrimSpace(s), now.Format("2006-01-02 15:04"))
	}
	return t, err
}

func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "0" || s == "all":
		return time.Time{}, nil
	case strings.HasSuffix(s, "d"):
		if n, err := strconv.Atoi(strings.TrimSuffix(s, "d")); err == nil && n > 0 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.ParseInLocation("2006-01-02", s, time.Local); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, errors.New("give how far back (7d, 12h, 90m), a date (2026-10-01) or a time (RFC 3339), or 0 for all")
}
