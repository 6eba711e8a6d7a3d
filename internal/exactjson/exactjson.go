// Package exactjson reads a JSON object to the letter: each key once, the
// keys named, nothing after it. It is how every body of the HTTP API and a
// turn request's budgets are read (docs/SECURITY.md).
package exactjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/timebox-run/timebox/internal/problem"
)

// Object returns the fields of b, which must be one JSON object and
// nothing after it, whose keys are each given at most once and, unless
// keys is nil, are among keys, matched exactly. It is how every body of
// the HTTP API, and a request's budgets, are read (docs/SECURITY.md):
// encoding/json alone would take "INPUT" for "input", keep the last of a
// key given twice, and, with a Decoder, ignore what follows the object, so
// that a body could mean one thing to the server and another to a proxy or
// a log reader in front of it. Its errors are sentences that quote the key
// in full; a caller that shows them cuts them to length.
func Object(b []byte, keys []string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := t.(string)
		if keys != nil && !slices.Contains(keys, key) {
			meant := ""
			if m := problem.Suggest(key, keys); m != "" {
				meant = "did you mean " + m + "? "
			}
			return nil, fmt.Errorf("unknown field %s (%sthe keys are %s, matched exactly)", strconv.Quote(key), meant, strings.Join(keys, ", "))
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("field %s given twice: give each key once", strconv.Quote(key))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		fields[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("something after the JSON object: send the object alone")
	}
	return fields, nil
}
