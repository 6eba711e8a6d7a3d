package script_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
)

func TestParseErrorsNameTheLine(t *testing.T) {
	cases := map[string]string{
		"{\"text\": \"a\"}\n{\"txt\": \"b\"}":         `test:2:2: unknown field "txt" (did you mean text?)`,
		`{"text": "a", "tool_calls": [{"nme": "x"}]}`: `test:1:31: unknown field "nme" (did you mean name?)`,
		`{"zzzzzz": 1}`:                       `test:1:2: unknown field "zzzzzz" (the fields are arguments, chunk_delay, chunks,`,
		`{"text": "a", "chunks": ["b"]}`:      "test:1:1: give text or chunks, not both",
		`{"chunk_delay": "10 ms"}`:            `test:1:1: "10 ms" is not a duration`,
		`{"tool_calls": [{"arguments": {}}]}`: "test:1:1: tool_calls[0]: name is required",
		`{"text": 5}`:                         "test:1:10: text is number, not string",
		`{"text": "a",}`:                      "test:1:14: invalid character '}' looking for beginning of object key string (each line is one JSON object)",
		`{"stall_after": -1}`:                 "test:1:1: stall_after is -1 (give a number of chunks, 0 or more)",
		`{"error": {"status": 99}}`:           "test:1:1: error.status 99 is not an HTTP status",
		"// a comment\n\n{\"text\": \"ok\"}\n{\"text\": \"ok\"} x": "test:4:16: one JSON object per line, found more after it",
	}
	for in, want := range cases {
		_, err := script.Parse(strings.NewReader(in), "test")
		var pe *script.ParseError
		if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: got %v\nwant %q", in, err, want)
		}
	}
}

// TestLoadRefusesWhatIsNotAFile: a FIFO (with no writer) or a device in
// place of the script is an error at once; reading either would block or
// never end.
func TestLoadRefusesWhatIsNotAFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "script.jsonl")
	testenv.Mkfifo(t, fifo)
	for path, want := range map[string]string{
		fifo:        "is a named pipe (FIFO), not a regular file",
		"/dev/zero": "/dev/zero is a character device, not a regular file",
	} {
		done := make(chan error, 1)
		go func() {
			_, err := script.Load(path)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: got %v, want %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Load blocked", path)
		}
	}
}

func TestPlaysInOrderPerConversationWithTimings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ls, err := script.Parse(strings.NewReader(`{"chunks": ["a", "b"], "first_chunk_delay": "1s", "chunk_delay": "50ms"}
{"text": "one two", "tool_calls": [{"name": "x", "arguments": {"k": 1}}, {"name": "y", "arguments": "not json"}]}
{"error": {"status": 429, "message": "slow down", "retry_after": "2s"}}`), "s")
		if err != nil {
			t.Fatal(err)
		}
		p, _ := script.New(ls)
		play := func(conv string) (model.Response, []time.Duration, error) {
			start := time.Now()
			s, err := p.Stream(context.Background(), model.Request{Conversation: conv})
			if err != nil {
				return model.Response{}, nil, err
			}
			var at []time.Duration
			for {
				_, err := s.Recv()
				if err == io.EOF {
					return s.Response(), at, nil
				}
				if err != nil {
					return model.Response{}, at, err
				}
				at = append(at, time.Since(start))
			}
		}
		r, at, _ := play("a")
		if r.Text != "ab" || len(at) != 2 || at[0] != time.Second || at[1] != 1050*time.Millisecond {
			t.Fatalf("line 1: %q at %v", r.Text, at)
		}
		if r, _, _ := play("b"); r.Text != "ab" {
			t.Fatal("conversations must not share a place in the script")
		}
		r, at, _ = play("a")
		if r.Text != "one two" || len(at) != 3 || len(r.ToolCalls) != 2 || r.ToolCalls[0].Arguments != `{"k": 1}` ||
			r.ToolCalls[1].Arguments != "not json" || r.FinishReason != "tool_calls" {
			t.Fatalf("line 2: %+v (%d chunks)", r, len(at))
		}
		_, _, err = play("a")
		var me *model.Error
		if me, _ = err.(*model.Error); me == nil || me.Status != 429 || me.RetryAfter != 2*time.Second {
			t.Fatalf("line 3: %v", err)
		}
		if r, _, _ := play("a"); r.Text != "ab" {
			t.Fatal("after the last line the script starts again")
		}
	})
}

func TestStallEndsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ls, _ := script.Parse(strings.NewReader(`{"chunks": ["a", "b"], "stall_after": 1}`), "s")
		p, _ := script.New(ls)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, _ := p.Stream(ctx, model.Request{})
		if c, err := s.Recv(); err != nil || c.Text != "a" {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := s.Recv(); err == nil || time.Since(start) != time.Minute {
			t.Fatalf("stall ended after %s with %v", time.Since(start), err)
		}
	})
}

// collect plays one call and returns its text, or the error.
func collect(t *testing.T, p model.Provider, req model.Request) (string, error) {
	t.Helper()
	s, err := p.Stream(t.Context(), req)
	if err != nil {
		return "", err
	}
	defer s.Close()
	for {
		if _, err := s.Recv(); err == io.EOF {
			return s.Response().Text, nil
		} else if err != nil {
			return "", err
		}
	}
}

// Compaction calls play the lines marked for compaction, in order, and the
// turn's calls skip them: a compaction never takes the turn's next reply.
func TestCompactionLines(t *testing.T) {
	ls, err := script.Parse(strings.NewReader(`{"text": "first"}
{"compaction": true, "text": "summary one"}
{"text": "second"}
{"compaction": true, "error": {"status": 503, "message": "overloaded"}}`), "s")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := script.New(ls)
	turn := model.Request{Conversation: "c"}
	compact := model.Request{Conversation: "c", Compaction: true, Messages: []model.Message{{Role: model.RoleUser, Content: "transcript"}}}
	var got []string
	for _, req := range []model.Request{compact, turn, compact, turn, compact, turn} {
		text, err := collect(t, p, req)
		if err != nil {
			text = "error: " + err.Error()
		}
		got = append(got, text)
	}
	want := []string{"summary one", "first", "error: script: HTTP 503: overloaded", "second", "summary one", "first"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("played\n %q\nwant\n %q", got, want)
	}
}

// Without compaction lines a compaction call gets a short summary that
// depends only on the request, and the turn's replies are untouched.
func TestDeterministicSummary(t *testing.T) {
	ls, _ := script.Parse(strings.NewReader(`{"text": "first"}
{"text": "second"}`), "s")
	p, _ := script.New(ls)
	compact := model.Request{Conversation: "c", Compaction: true, Messages: []model.Message{{Role: model.RoleUser,
		Content: "[user]\nhello " + strings.Repeat("é", 1<<20)}}}
	a, err := collect(t, p, compact)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := collect(t, p, compact)
	if a != b || len(a) > 300 || !strings.HasPrefix(a, "(script model summary of 2097165 bytes of earlier conversation) [user] hello é") ||
		!utf8.ValidString(a) {
		t.Fatalf("summaries %q and %q", a, b)
	}
	if text, _ := collect(t, p, model.Request{Conversation: "c"}); text != "first" {
		t.Fatalf("the turn's first reply is %q", text)
	}
}

func TestCompactionLineChecks(t *testing.T) {
	if _, err := script.Parse(strings.NewReader(`{"compaction": true, "tool_calls": [{"name": "x"}]}`), "s"); err == nil ||
		!strings.Contains(err.Error(), "s:1:1: a compaction line is a summary") {
		t.Fatalf("got %v", err)
	}
	ls, _ := script.Parse(strings.NewReader(`{"compaction": true, "text": "only a summary"}`), "s")
	if _, err := script.New(ls); err == nil || !strings.Contains(err.Error(), "every line is a compaction line") {
		t.Fatalf("got %v", err)
	}
}

// A scripted length refusal reads as one, as the real providers' do.
func TestScriptedLengthRefusal(t *testing.T) {
	ls, _ := script.Parse(strings.NewReader(`{"error": {"status": 400, "message": "This model's maximum context length is 8192 tokens."}}
{"error": {"status": 400, "message": "bad tool schema"}}`), "s")
	p, _ := script.New(ls)
	for _, want := range []bool{true, false} {
		_, err := p.Stream(t.Context(), model.Request{})
		var me *model.Error
		if !errors.As(err, &me) || me.TooLong != want {
			t.Fatalf("err %v: too long %v, want %v", err, me != nil && me.TooLong, want)
		}
	}
}

// TestParseErrorColumnsCountLeadingSpace: the column is in the line as a
// person sees it, spaces before the object included.
func TestParseErrorColumnsCountLeadingSpace(t *testing.T) {
	_, err := script.Parse(strings.NewReader("\t  {\"txt\": 1}"), "s")
	if err == nil || !strings.HasPrefix(err.Error(), `s:1:5: unknown field "txt"`) {
		t.Fatalf("got %v", err)
	}
}

// TestResumeGoesOnWhereSuspended: a conversation's place, suspended by one
// provider and resumed by another playing the same script (another
// process), plays on from there.
func TestResumeGoesOnWhereSuspended(t *testing.T) {
	lines, err := script.Parse(strings.NewReader(`{"text": "one"}`+"\n"+`{"text": "two"}`+"\n"+`{"text": "three"}`), "s")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := script.New(lines)
	b, _ := script.New(lines)
	req := model.Request{Conversation: "c1"}
	if got, _ := collect(t, a, req); got != "one" {
		t.Fatalf("first reply %q", got)
	}
	b.Resume("c1", a.Suspend("c1"))
	if got, _ := collect(t, b, req); got != "two" {
		t.Errorf("resumed elsewhere, the next reply is %q, want two", got)
	}
	b.Resume("c1", []byte("not json")) // ignored
	if got, _ := collect(t, b, req); got != "three" {
		t.Errorf("after a state it cannot read, the next reply is %q, want three", got)
	}
}
