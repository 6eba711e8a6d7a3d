package tool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Schema is a compiled input schema. The zero Schema accepts any JSON
// object.
type Schema struct {
	resolved *jsonschema.Resolved
}

// NotAnObject says what is wrong with the top-level "type" of an input
// schema, t as JSON decodes it, when it is not "object": a tool's
// arguments are always a JSON object, so no call could pass it. It
// returns "" for "object".
func NotAnObject(t any) string {
	if t == "object" {
		return ""
	}
	b, _ := json.Marshal(t)
	return fmt.Sprintf("is %s, but a tool's arguments are always a JSON object (use type: object)", b)
}

// CompileSchema compiles a JSON Schema. An empty raw accepts any object.
// A schema whose type is given and is not "object" is an error
// (NotAnObject).
func CompileSchema(raw json.RawMessage) (*Schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return &Schema{}, nil
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("input_schema is not a JSON Schema: %w", err)
	}
	var top struct {
		Type any `json:"type"`
	}
	if json.Unmarshal(raw, &top) == nil && top.Type != nil {
		if p := NotAnObject(top.Type); p != "" {
			return nil, fmt.Errorf("input_schema.type %s", p)
		}
	}
	if err := checkTypes(raw); err != nil {
		return nil, err
	}
	r, err := s.Resolve(nil)
	if err != nil {
		// Without the library's own words for the schema
		// ("jsonschema.Schema: <anonymous schema>: pattern: …").
		msg := strings.TrimPrefix(err.Error(), "jsonschema.Schema: ")
		msg = strings.TrimPrefix(msg, "<anonymous schema>: ")
		return nil, fmt.Errorf("input_schema: %s", msg)
	}
	return &Schema{resolved: r}, nil
}

// ArgumentError says why a call's arguments were refused. Field is the JSON
// pointer of the offending value ("/url"), empty for the whole input.
type ArgumentError struct {
	Reason string // invalid_json or invalid_arguments
	// Field is the JSON pointer of the offending value; empty for the
	// whole input.
	Field string
	// Message says what is wrong with the value, for the model.
	Message string
}

// Error returns Message.
func (e *ArgumentError) Error() string { return e.Message }

var (
	schemaPathRE = regexp.MustCompile(`validating (/properties/[^\s:]+|/items[^\s:]*)`)
	missingRE    = regexp.MustCompile(`missing properties: \[?"([^"]+)"`)
	extraRE      = regexp.MustCompile(`unexpected additional properties \[?"([^"]+)"`)
)

// Check validates a call's arguments: they must be a JSON object that
// satisfies the schema. The returned *ArgumentError names the field.
func (s *Schema) Check(args json.RawMessage) error {
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		if err == nil {
			err = fmt.Errorf("trailing data after the object")
		}
		return &ArgumentError{Reason: "invalid_json", Message: fmt.Sprintf("The arguments are not valid JSON (%v). Send a JSON object.", err)}
	}
	if _, ok := v.(map[string]any); !ok {
		return &ArgumentError{Reason: "invalid_arguments", Message: "The arguments must be a JSON object."}
	}
	if s == nil || s.resolved == nil {
		return nil
	}
	// The validator wants float64 numbers, not json.Number.
	var plain any
	if err := json.Unmarshal(args, &plain); err != nil {
		return &ArgumentError{Reason: "invalid_json", Message: err.Error()}
	}
	if err := s.resolved.Validate(plain); err != nil {
		msg := err.Error()
		field := ""
		if m := missingRE.FindStringSubmatch(msg); m != nil {
			field = "/" + m[1]
			return &ArgumentError{Reason: "invalid_arguments", Field: field,
				Message: fmt.Sprintf("Missing required argument %q.", m[1])}
		}
		if m := extraRE.FindStringSubmatch(msg); m != nil {
			field = "/" + m[1]
			return &ArgumentError{Reason: "invalid_arguments", Field: field,
				Message: fmt.Sprintf("Unknown argument %q.", m[1])}
		}
		var parts []string
		for _, m := range schemaPathRE.FindAllStringSubmatch(msg, -1) {
			p := strings.ReplaceAll(m[1], "/properties/", "/")
			parts = append(parts, strings.TrimPrefix(p, "/items"))
		}
		if len(parts) > 0 {
			field = parts[len(parts)-1]
		}
		detail := msg
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			detail = msg[i+2:]
		}
		// The validator says a type mismatch in Go's words ("<invalid
		// reflect.Value> has type \"null\"" for a null): said in JSON's.
		if m := typeRE.FindStringSubmatch(detail); m != nil {
			detail = fmt.Sprintf("it is %s, and the tool takes %s", jsonKind(m[1]), wanted(m[2]))
		}
		if field != "" {
			return &ArgumentError{Reason: "invalid_arguments", Field: field,
				Message: fmt.Sprintf("Argument %q is invalid: %s.", strings.TrimPrefix(field, "/"), detail)}
		}
		return &ArgumentError{Reason: "invalid_arguments", Message: "The arguments do not match the tool's input schema: " + detail + "."}
	}
	return nil
}

// typeRE matches the validator's type mismatch: the value, its JSON type,
// the type (or types) the schema wants.
var typeRE = regexp.MustCompile(`^.* has type "([a-z]+)", want (.+)$`)

// jsonKind names a JSON type with its article: "a string", "null".
func jsonKind(t string) string {
	switch t {
	case "null":
		return "null"
	case "array", "integer", "object":
		return "an " + t
	}
	return "a " + t
}

// wanted says the validator's wanted types ("\"string\"", "one of
// \"integer, null\"") in words: "a string", "an integer or null".
func wanted(w string) string {
	w = strings.TrimPrefix(w, "one of ")
	ts := strings.Split(strings.Trim(w, `"`), ", ")
	for i, t := range ts {
		ts[i] = jsonKind(t)
	}
	return strings.Join(ts, " or ")
}

// jsonTypes are the types a JSON Schema's "type" may name.
var jsonTypes = map[string]bool{"string": true, "number": true, "integer": true, "boolean": true, "object": true, "array": true, "null": true}

// checkTypes refuses a schema whose "type" names no JSON type ("strng"):
// the validator takes it, and every call's arguments would then be
// refused, as if the model had sent bad ones. Values that are data
// (enum, const, default, examples) are not looked into.
func checkTypes(raw json.RawMessage) error {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil // said by the caller's own unmarshalling
	}
	var walk func(v any, at string) error
	walk = func(v any, at string) error {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				switch k {
				case "enum", "const", "default", "examples":
					continue
				case "type":
					names, _ := c.([]any)
					if s, ok := c.(string); ok {
						names = []any{s}
					}
					for _, n := range names {
						if s, ok := n.(string); ok && !jsonTypes[s] {
							return fmt.Errorf("input_schema: %stype %q is not a JSON type (string, number, integer, boolean, object, array or null)", at, s)
						}
					}
					if _, isSchema := c.(map[string]any); !isSchema {
						continue
					}
				}
				if err := walk(c, at+k+": "); err != nil {
					return err
				}
			}
		case []any:
			for _, c := range x {
				if err := walk(c, at); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(v, "")
}
