package config

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// This file turns the text of a value (from the agent file, a flag or a
// variable) into a duration, a count or a size, and words the problem when
// it cannot. Every message is a sentence fragment that follows
// "KEY: " and ends with the fix in parentheses, as spec §10 shows.

// value is one raw value as it was written, wherever it came from.
type value struct {
	// text is the value without quotes.
	text string
	// number is true for a YAML integer or float (unquoted), false for a
	// string and for every flag and variable.
	number bool
	// bare is true for a YAML true/false: shown unquoted, but not a number.
	bare bool
}

// show renders the value for a message: strings quoted, YAML numbers as
// written, so that `timeout: 30` reads `30 is not a duration`, and
// `timeout: 10 mins` reads `"10 mins" is not a duration`.
func (v value) show() string {
	if v.number || v.bare {
		return v.text
	}
	return strconv.Quote(v.text)
}

// offWords are what people write for "no limit" in other tools. timebox
// writes off as 0, and says so rather than guessing.
var offWords = map[string]bool{
	"off": true, "none": true, "never": true, "disabled": true, "disable": true, "false": true,
	"no": true, "unlimited": true, "infinite": true, "inf": true, ".inf": true, "null": true,
}

// offProblem words the problem of a value that means "off", or returns ""
// when v does not. zeroOK says whether the setting may be off; example is
// a value to suggest when it may not.
func offProblem(v value, zeroOK bool, what, example string) string {
	if !offWords[strings.ToLower(strings.TrimSpace(v.text))] {
		return ""
	}
	if zeroOK {
		return fmt.Sprintf("%s is not %s (use 0 for off)", v.show(), what)
	}
	return fmt.Sprintf("%s is not %s, and this budget cannot be off (use %s such as %s)", v.show(), what, what, example)
}

// bounds are the values a setting accepts.
type bounds struct {
	min, max int64
	// zeroOK allows 0 below min: "off" for most budgets, "at once" for the
	// graces.
	zeroOK bool
}

const (
	minDuration = int64(time.Millisecond)
	maxDuration = int64(24 * time.Hour)
)

// durationBounds are those of every time budget that may not be off.
var durationBounds = bounds{min: minDuration, max: maxDuration}

// parseDuration reads a Go duration. It returns the problem, worded with a
// fix, when text is not one.
func parseDuration(v value) (time.Duration, string) {
	s := strings.TrimSpace(v.text)
	if s == "0" || (v.number && isZeroNumber(s)) {
		return 0, ""
	}
	if !v.number && overflows(s) {
		// Go's syntax, but past what a duration holds: the largest one,
		// for the caller's range check to say what the limit is.
		return time.Duration(math.MaxInt64), ""
	}
	if !v.number {
		if d, err := time.ParseDuration(s); err == nil {
			return d, ""
		}
	}
	if !v.number && strings.ContainsAny(s, "hms") {
		// "1m30" lacks the unit of its last number; seconds is the only
		// reading that parses.
		if _, err := time.ParseDuration(s + "s"); err == nil && s[len(s)-1] >= '0' && s[len(s)-1] <= '9' {
			return 0, fmt.Sprintf("%s is not a duration (use %ss)", v.show(), s)
		}
	}
	if fix, ok := durationFix(s); ok {
		return 0, fmt.Sprintf("%s is not a duration (use %s)", v.show(), fix)
	}
	return 0, fmt.Sprintf("%s is not a duration (use Go syntax such as 90s, 5m or 1h30m)", v.show())
}

// goDurationRE is Go's duration syntax, without a sign.
var goDurationRE = regexp.MustCompile(`^(?:[0-9]*(?:\.[0-9]*)?(?:ns|us|µs|μs|ms|s|m|h))+$`)

// unitNS are the nanoseconds of Go's duration units.
var unitNS = map[string]float64{"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}

var goDurationPartRE = regexp.MustCompile(`([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)`)

// overflows reports whether s is written in Go's duration syntax but is
// longer than a time.Duration holds (about 292 years): time.ParseDuration
// calls it "invalid", as it does a typo.
func overflows(s string) bool {
	if !goDurationRE.MatchString(s) {
		return false
	}
	total := 0.0
	for _, m := range goDurationPartRE.FindAllStringSubmatch(s, -1) {
		n, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return false
		}
		total += n * unitNS[m[2]]
	}
	return total > math.MaxInt64
}

func isZeroNumber(s string) bool {
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && f == 0
}

var (
	bareNumberRE = regexp.MustCompile(`^[+-]?[0-9]+(\.[0-9]+)?$`)
	durPartRE    = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Zµμ]+)\s*,?\s*(?:and\s+)?`)
)

// durationUnits maps the ways people write a unit to Go's.
var durationUnits = map[string]string{
	"ns": "ns", "nsec": "ns", "nsecs": "ns", "nanosecond": "ns", "nanoseconds": "ns",
	"us": "us", "µs": "us", "μs": "us", "usec": "us", "usecs": "us", "microsecond": "us", "microseconds": "us",
	"ms": "ms", "msec": "ms", "msecs": "ms", "milli": "ms", "millis": "ms", "millisecond": "ms", "milliseconds": "ms",
	"s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
	"h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
	"d": "d", "day": "d", "days": "d",
}

// durationFix guesses what a malformed duration meant: "30" → "30s",
// "10 mins" → "10m", "1 hour 30 minutes" → "1h30m", "2d" → "48h". It
// reports false when it cannot tell.
func durationFix(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if bareNumberRE.MatchString(s) {
		return strings.TrimPrefix(strings.TrimPrefix(s, "+"), "-") + "s", true
	}
	s = strings.TrimPrefix(strings.TrimPrefix(s, "+"), "-")
	var out strings.Builder
	for s != "" {
		m := durPartRE.FindStringSubmatch(s)
		if m == nil {
			return "", false
		}
		unit, ok := durationUnits[strings.ToLower(m[2])]
		if !ok {
			return "", false
		}
		if unit == "d" {
			f, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return "", false
			}
			out.WriteString(strconv.FormatFloat(f*24, 'f', -1, 64) + "h")
		} else {
			out.WriteString(m[1] + unit)
		}
		s = s[len(m[0]):]
	}
	fix := out.String()
	if _, err := time.ParseDuration(fix); err != nil {
		return "", false
	}
	return fix, true
}

// checkDuration parses v and checks it against b. example is the value a
// fix suggests when v is out of range (the setting's default, usually).
func checkDuration(v value, b bounds, example string) (time.Duration, string) {
	if p := offProblem(v, b.zeroOK, "a duration", example); p != "" {
		return 0, p
	}
	if v.number && strings.HasPrefix(strings.TrimSpace(v.text), "-") {
		return 0, negative(v, b, "a duration such as "+example)
	}
	d, problem := parseDuration(v)
	if problem != "" {
		return 0, problem
	}
	return d, durationRange(v, d, b, example)
}

func durationRange(v value, d time.Duration, b bounds, example string) string {
	switch {
	case d < 0:
		return negative(v, b, "a duration such as "+example)
	case d == 0 && b.zeroOK:
		return ""
	case d == 0:
		return fmt.Sprintf("%s is not allowed: this budget cannot be off (use a duration such as %s)", v.show(), example)
	case int64(d) < b.min:
		if b.zeroOK {
			return fmt.Sprintf("%s is below %s, the smallest budget a record can show (use at least %s, or 0 for off)", v.show(), fmtDuration(time.Duration(b.min)), fmtDuration(time.Duration(b.min)))
		}
		return fmt.Sprintf("%s is below %s, the smallest budget a record can show (use at least %s)", v.show(), fmtDuration(time.Duration(b.min)), fmtDuration(time.Duration(b.min)))
	case int64(d) > b.max:
		return fmt.Sprintf("%s is above %s, the largest allowed (lower it)", v.show(), fmtDuration(time.Duration(b.max)))
	}
	return ""
}

// parseCount reads a whole number. A quoted number is accepted: flags and
// variables are always text, and `max_steps: "25"` can mean only one thing.
func parseCount(v value) (int64, string) {
	s := strings.TrimSpace(v.text)
	n, err := strconv.ParseInt(s, 10, 64)
	if err == nil || errors.Is(err, strconv.ErrRange) {
		// Past int64: the largest (or smallest) one, for the caller's
		// range check to say what the limit is.
		return n, ""
	}
	if f, ferr := strconv.ParseFloat(s, 64); ferr == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
		if f == math.Trunc(f) {
			if math.Abs(f) >= math.MaxInt64 {
				return int64(math.Copysign(math.MaxInt64, f)), ""
			}
			return 0, fmt.Sprintf("%s is not written as a whole number (use %d)", v.show(), int64(f))
		}
		return 0, fmt.Sprintf("%s is not a whole number (use %d)", v.show(), int64(math.Round(f)))
	}
	return 0, fmt.Sprintf("%s is not a whole number", v.show())
}

// negative words a negative value, which in other tools often means "no
// limit"; here that is 0, where the setting allows it.
func negative(v value, b bounds, use string) string {
	if b.zeroOK {
		return fmt.Sprintf("%s is negative (use %s, or 0 for off)", v.show(), use)
	}
	return fmt.Sprintf("%s is negative (use %s)", v.show(), use)
}

func checkCount(v value, b bounds) (int64, string) {
	if p := offProblem(v, b.zeroOK, "a whole number", strconv.FormatInt(b.min, 10)); p != "" {
		return 0, p
	}
	n, problem := parseCount(v)
	if problem != "" {
		return 0, problem
	}
	return n, countRange(v, n, b, strconv.FormatInt)
}

func countRange(v value, n int64, b bounds, format func(int64, int) string) string {
	switch {
	case n < 0:
		return negative(v, b, "at least "+format(b.min, 10))
	case n == 0 && b.zeroOK:
		return ""
	case n < b.min:
		if b.zeroOK {
			return fmt.Sprintf("%s is below the minimum (use at least %s, or 0 for off)", v.show(), format(b.min, 10))
		}
		return fmt.Sprintf("%s is below the minimum (use at least %s)", v.show(), format(b.min, 10))
	case n > b.max:
		return fmt.Sprintf("%s is above the maximum (use at most %s)", v.show(), format(b.max, 10))
	}
	return ""
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

// sizeUnits are the binary units the agent file accepts, lowercased.
// Decimal-looking units (KB, MB, GB, K, M, G) are refused: people mean
// 1000 or 1024 by them about equally often, and a limit that is 5% off
// from what its author meant is a budget that is not honest. See
// docs/decisions/budget-bounds.md.
var sizeUnits = map[string]int64{"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}

var ambiguousUnits = map[string]int64{
	"k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
}

// parseSize reads a byte size: 1048576, 1024B, 512KiB, 1MiB, 1GiB.
func parseSize(v value) (int64, string) {
	s := strings.TrimSpace(v.text)
	m := sizeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Sprintf("%s is not a size (use bytes, or KiB, MiB or GiB, such as 1MiB)", v.show())
	}
	unit := strings.ToLower(m[2])
	if mult, ok := ambiguousUnits[unit]; ok {
		num, _ := strconv.ParseFloat(m[1], 64)
		bin := int64(num * float64(mult))
		dec := int64(num * float64(decimalOf(mult)))
		return 0, fmt.Sprintf("%s is ambiguous (use %s for %d bytes, or %d)", v.show(), budget.FormatBytes(bin), bin, dec)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Sprintf("%s is not a size (use bytes, or KiB, MiB or GiB, such as 1MiB)", v.show())
	}
	if strings.Contains(m[1], ".") {
		f, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			n := f * float64(mult)
			if n == math.Trunc(n) && n < math.MaxInt64/2 {
				return 0, fmt.Sprintf("%s is not a whole number of bytes (use %s)", v.show(), budget.FormatBytes(int64(n)))
			}
		}
		return 0, fmt.Sprintf("%s is not a whole number of bytes (use a whole number with a unit, such as 1536KiB)", v.show())
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		// Past int64: the largest, for the caller's range check to say
		// what the limit is.
		return math.MaxInt64, ""
	}
	return n * mult, ""
}

// decimalOf returns the SI value of a binary multiplier: 1024 → 1000.
func decimalOf(mult int64) int64 {
	switch mult {
	case 1 << 10:
		return 1000
	case 1 << 20:
		return 1000 * 1000
	}
	return 1000 * 1000 * 1000
}

func checkSize(v value, b bounds) (int64, string) {
	n, problem := parseSize(v)
	if problem != "" {
		return 0, problem
	}
	return n, countRange(v, n, b, func(n int64, _ int) string { return budget.FormatBytes(n) })
}

// fmtDuration renders a duration the way a person writes it: 10m rather
// than Go's 10m0s, 1h rather than 1h0m0s.
//
// Whole seconds under two minutes stay in seconds, because that is how the
// spec and most files write them (60s, 90s), and a table that printed 1m
// would look like a different value from the one in the file.
func fmtDuration(d time.Duration) string { return budget.FormatDuration(d) }

// checkSwitch reads an on/off setting: on is 1, off is 0. Only the two
// words are taken; YAML's true/false and the like are refused with the
// word to write, so that a file reads the same everywhere.
func checkSwitch(v value) (int64, string) {
	switch strings.ToLower(strings.TrimSpace(v.text)) {
	case "on":
		return 1, ""
	case "off":
		return 0, ""
	}
	return 0, fmt.Sprintf("%s is not on or off (write on or off)", v.show())
}
