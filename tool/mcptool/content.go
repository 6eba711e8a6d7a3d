package mcptool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/tool"
)

// maxNameLen is the longest tool name model APIs accept.
const maxNameLen = 64

// toolNames returns "<entry>__<tool>" for each of the server's tools,
// reduced to what model APIs accept (letters, digits, _ and -, at most 64)
// and unique. A name that had to be shortened, or that collides with an
// earlier one after its other characters became _, ends with a short hash
// of the server's own name, so that it is stable across restarts and runs.
// See docs/decisions/mcp-tool-names.md.
func toolNames(entry string, remote []string) []string {
	out := make([]string, len(remote))
	seen := map[string]bool{}
	for i, r := range remote {
		name := sanitize(entry + "__" + r)
		if len(name) > maxNameLen || seen[name] {
			name = withHash(name, r)
		}
		for n := 2; seen[name]; n++ { // two server names with the same hash prefix: vanishingly rare
			name = withHash(name, fmt.Sprintf("%s#%d", r, n))
		}
		seen[name] = true
		out[i] = name
	}
	return out
}

// sanitize replaces every character a model API would refuse by _.
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// withHash cuts name to leave room for "_" and 8 hex digits of remote's
// hash, and appends them.
func withHash(name, remote string) string {
	sum := sha256.Sum256([]byte(remote))
	h := hex.EncodeToString(sum[:4])
	if len(name) > maxNameLen-len(h)-1 {
		name = name[:maxNameLen-len(h)-1]
	}
	return name + "_" + h
}

// inputSchema returns a tool's input schema as the agent needs it: JSON that
// tool.CompileSchema accepts. A schema that does not compile is replaced
// by "any object", so that one odd tool does not take the whole agent down;
// the server still validates its own arguments. warning says why, or is "".
func inputSchema(v any) (json.RawMessage, string) {
	raw, err := json.Marshal(v)
	if err != nil || string(raw) == "null" {
		return nil, ""
	}
	if _, err := tool.CompileSchema(raw); err != nil {
		return json.RawMessage(`{"type":"object"}`), fmt.Sprintf("the server's input schema does not compile (%v); any object is accepted and the server validates", err)
	}
	return raw, ""
}

// resultText renders a tool result for the model: the text of its content
// blocks, in order, one per line. Other blocks are described rather than
// inlined (an image's base64 would only waste the model's context). With no
// content at all, the structured content is given as JSON.
func resultText(res *mcp.CallToolResult) []byte {
	var parts []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource %s: %s]", c.Name, c.URI))
		case *mcp.EmbeddedResource:
			if r := c.Resource; r != nil {
				if r.Text != "" {
					parts = append(parts, r.Text)
				} else {
					parts = append(parts, fmt.Sprintf("[resource %s, %s, %d bytes]", r.URI, r.MIMEType, len(r.Blob)))
				}
			}
		default:
			if b, err := json.Marshal(c); err == nil {
				parts = append(parts, string(b))
			}
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			return b
		}
	}
	return []byte(strings.Join(parts, "\n"))
}

// toolReport turns a progress notification's fields into a tool.Report.
// MCP's total is optional; a zero total means unknown.
func toolReport(progress, total *float64, message string) tool.Report {
	r := tool.Report{Progress: progress, Message: message}
	if total != nil && *total != 0 {
		r.Total = total
	}
	return r
}

// tailString returns the last n bytes of s, starting at a rune boundary.
func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return "…" + s
}
