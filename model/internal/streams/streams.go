// Package streams holds what the streaming providers share of HTTP (it
// keeps net/http out of package model, which the core imports).
package streams

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/timebox-run/timebox/model"
)

// Only returns the transport of a provider's streamed requests: a
// successful answer that is a JSON document, not an event stream — a
// gateway's quota or error object sent with status 200, a completion a
// server would not stream — is refused as a *Error saying what it says.
// The SDKs skip its lines as not being events, and the attempt said
// only that the stream ended before the reply was complete. rt nil is
// http.DefaultTransport.
func Only(rt http.RoundTripper, provider string) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return streamsOnly{rt: rt, provider: provider}
}

type streamsOnly struct {
	rt       http.RoundTripper
	provider string
}

// documentBytes is how much of a document answered for a stream is read
// for its message.
const documentBytes = 64 << 10

func (s streamsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" {
		return resp, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, documentBytes))
	resp.Body.Close()
	return nil, &model.Error{Provider: s.provider, Message: documentMessage(b)}
}

// documentMessage says what a JSON document answered for a stream says:
// its error's message when it has one ({"error": {"message": …}},
// {"error": "…"}, {"message": …}), else its start.
func documentMessage(b []byte) string {
	var doc struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(b, &doc) == nil {
		var e struct {
			Message string `json:"message"`
		}
		var text string
		switch {
		case json.Unmarshal(doc.Error, &e) == nil && e.Message != "":
			return "answered with an error instead of a stream: " + e.Message
		case json.Unmarshal(doc.Error, &text) == nil && text != "":
			return "answered with an error instead of a stream: " + text
		case doc.Message != "":
			return "answered with an error instead of a stream: " + doc.Message
		}
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return fmt.Sprintf("answered with a JSON document instead of a stream (was streaming turned off?): %s", s)
}
