// Package ids makes the random identifiers timebox hands out: turn ids,
// session ids, the id of a store's owner process.
package ids

import "crypto/rand"

// New returns prefix followed by 26 random characters of base32
// (crypto/rand.Text: 128 bits, letters A–Z and digits 2–7), so an id is
// safe in a URL, a header, a file name and a SQL literal.
func New(prefix string) string { return prefix + rand.Text() }
