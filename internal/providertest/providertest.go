// Package providertest holds the conformance tests every streaming model
// provider must pass, run against a fakellm server speaking the provider's
// wire format: the first-chunk and idle watchdogs fire on a real stream and
// hang up on the server, and a cancelled context ends Recv promptly with
// the context's own cause.
package providertest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/model"
)

// New makes the provider under test for a fake server.
type New func(s *fakellm.Server) model.Provider

func watchdog(d time.Duration) model.Watchdog {
	return model.Watchdog{FirstChunk: budget.Duration{D: d, Knob: budget.KeyLLMFirstChunk}, Idle: budget.Duration{D: d, Knob: budget.KeyLLMIdle}}
}

// Watchdogs: a stall before the headers or the first event is
// llm_first_chunk, a stall mid-stream llm_idle; each fires at its limit
// (300ms, checked within 3s) and the server sees the client go away.
func Watchdogs(t *testing.T, format fakellm.Format, newProvider New) {
	cases := []struct {
		name  string
		reply fakellm.Reply
		phase budget.Phase
	}{
		{"stall before headers", fakellm.Reply{StallBeforeHeaders: true}, budget.PhaseLLMFirstChunk},
		{"stall before the first chunk", fakellm.Reply{Stall: true, StallAfter: 0, Chunks: []fakellm.Chunk{{Text: "x"}}}, budget.PhaseLLMFirstChunk},
		{"stall mid-stream", fakellm.Reply{Stall: true, StallAfter: 2, Chunks: []fakellm.Chunk{{Text: "a"}, {Text: "b"}, {Text: "c"}}}, budget.PhaseLLMIdle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fakellm.New(format, tc.reply)
			defer s.Close()
			start := time.Now()
			w := model.Open(t.Context(), newProvider(s), model.Request{Model: "m"}, watchdog(300*time.Millisecond), "model m")
			var err error
			for err == nil {
				_, err = w.Recv()
			}
			w.Close()
			el := time.Since(start)
			te, ok := budget.AsTimeout(err)
			if !ok || te.Phase != tc.phase {
				t.Fatalf("err %v", err)
			}
			if el < 300*time.Millisecond || el > 3*time.Second {
				t.Fatalf("fired after %s", el)
			}
			select {
			case <-s.Gone(0):
			case <-time.After(5 * time.Second):
				t.Fatal("the server never saw the client go away")
			}
		})
	}
}

// CancelEndsRecv: cancelling the stream's context mid-stall ends Recv
// within 3s with the context's cause (here client_gone), not a provider
// error.
func CancelEndsRecv(t *testing.T, format fakellm.Format, newProvider New) {
	s := fakellm.New(format, fakellm.Reply{Stall: true, StallAfter: 1, Chunks: []fakellm.Chunk{{Text: "a"}, {Text: "b"}}})
	defer s.Close()
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	st, err := newProvider(s).Stream(ctx, model.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { cancel(&budget.CancelError{Reason: budget.ClientGone}) })
	start := time.Now()
	for err == nil { // the events already sent may come first
		_, err = st.Recv()
	}
	if ce, ok := budget.AsCancel(err); !ok || ce.Reason != budget.ClientGone || time.Since(start) > 3*time.Second {
		t.Fatalf("err %v after %s", err, time.Since(start))
	}
}

// Collect reads a reply stream to its end (within 10s): its chunks, and
// its response when it ended with io.EOF, else the error it ended with.
func Collect(t *testing.T, p model.Provider, req model.Request) ([]model.Chunk, model.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := p.Stream(ctx, req)
	if err != nil {
		return nil, model.Response{}, err
	}
	defer s.Close()
	var chunks []model.Chunk
	for {
		c, err := s.Recv()
		if err == io.EOF {
			return chunks, s.Response(), nil
		}
		if err != nil {
			return chunks, model.Response{}, err
		}
		chunks = append(chunks, c)
	}
}

// TextKept: a request that says its caller keeps the streamed text
// (Request.TextKept) gets the same chunks, and a Response without the
// text; one that does not, the text joined.
func TextKept(t *testing.T, format fakellm.Format, newProvider New) {
	s := fakellm.New(format, fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}, {Text: "bc"}, {Text: "d"}}})
	defer s.Close()
	for _, kept := range []bool{false, true} {
		chunks, resp, err := Collect(t, newProvider(s), model.Request{Model: "m", TextKept: kept})
		if err != nil {
			t.Fatal(err)
		}
		streamed := ""
		for _, c := range chunks {
			streamed += c.Text
		}
		want := "abcd"
		if kept {
			want = ""
		}
		if streamed != "abcd" || resp.Text != want {
			t.Errorf("TextKept %v: streamed %q, Response's text %q, want %q", kept, streamed, resp.Text, want)
		}
	}
}

// DocumentForAStream: a server that answers a streamed request with status
// 200 and a JSON document — a gateway's quota error, a completion it
// would not stream — fails the attempt saying what the document says,
// not that the stream ended early.
func DocumentForAStream(t *testing.T, newURLProvider func(baseURL string) model.Provider) {
	for _, tc := range []struct{ body, want string }{
		{`{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota"}}`, "answered with an error instead of a stream: You exceeded your current quota"},
		{`{"id": "chatcmpl-1", "choices": [{"message": {"content": "hi"}}]}`, "answered with a JSON document instead of a stream"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, tc.body)
		}))
		_, _, err := Collect(t, newURLProvider(srv.URL), model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}})
		srv.Close()
		var me *model.Error
		if !errors.As(err, &me) || !strings.Contains(me.Message, tc.want) {
			t.Errorf("a 200 with %s: %v, want a model error saying %q", tc.body, err, tc.want)
		}
	}
}
