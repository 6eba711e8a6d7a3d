// Package ids makes the random identifiers timebox hands out: turn ids,
// session ids, the id of a store's owner process.
package ids

import (
	"crypto/rand"
	"strings"
)

// Form says what follows an id's prefix, for documentation.
const Form = "26 characters of base32 (A–Z, 2–7)"

// New returns prefix followed by 26 random characters of base32
// (crypto/rand.Text: 128 bits, letters A–Z and digits 2–7), so an id is
// safe in a URL, a header, a file name and a SQL literal.
func New(prefix string) string { return prefix + rand.Text() }

// Is reports whether s has the form New gives ids with prefix: the prefix
// and 26 characters of A–Z and 2–7.
func Is(prefix, s string) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(rest) != 26 {
		return false
	}
	for _, c := range []byte(rest) {
		if (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
