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
		"{\"text\": \"a\"}\n{\"txt\": \"b\"}":         `test:2:2: txt: unknown field (did you mean text?)`,
		`{"text": "a", "tool_calls": [{"nme": "x"}]}`: `test:1:31: tool_calls[0].nme: unknown field (did you mean name?)`,
		`{"zzzzzz": 1}`:                                            `test:1:2: zzzzzz: unknown field (the fields of the line are chunk_delay, chunks, compaction, error, expect_in_request, first_chunk_delay, stall_after, text, tool_calls)`,
		`{"text": "a", "chunks": ["b"]}`:                           "test:1:25: chunks: give text or chunks, not both",
		`{"chunk_delay": "10 ms"}`:                                 `test:1:17: chunk_delay: "10 ms" is not a duration (use Go syntax like "50ms" or "2s")`,
		`{"tool_calls": [{"arguments": {}}]}`:                      `test:1:17: tool_calls[0].name: a call needs the name of its tool (such as "name": "search")`,
		`{"text": 5}`:                                              `test:1:10: text: 5 is not a string (put it in quotes: "5")`,
		`{"text": "a",}`:                                           "test:1:14: invalid character '}' looking for beginning of object key string (remove the comma before it: JSON allows none after the last item)",
		`{"stall_after": -1}`:                                      "test:1:17: stall_after: -1 is negative (give a number of chunks, 0 or more)",
		`{"error": {"status": 99}}`:                                "test:1:22: error.status: 99 is not an HTTP status (give 100 to 599, or 0 for a connection failure)",
		`{"text": "a", "expect_in_request": ["x", ""]}`:            "test:1:42: expect_in_request[1]: an empty text is in every request (give the text the request must contain)",
		"// a comment\n\n{\"text\": \"ok\"}\n{\"text\": \"ok\"} x": "test:4:16: one JSON object per line, found more after it",
		// A byte-order mark (Notepad) is not part of the first line: its
		// columns are the editor's.
		"\xef\xbb\xbf{\"text\": 5}":                    `test:1:10: text: 5 is not a string (put it in quotes: "5")`,
		`{"text": "a", "text": "b"}`:                   "test:1:15: text: given twice (give each field once)",
		`{"tool_calls": [{"name": "x", "Name": "y"}]}`: "test:1:31: tool_calls[0].name: given twice (give each field once)",
		"{\"text\": \"caf\xe9\"}":                      "test:1:14: the line is not UTF-8 text: byte 0xe9 here is not part of a character (save the file as UTF-8)",
	}
	for in, want := range cases {
		_, err := script.Parse(strings.NewReader(in), "test")
		var pe *script.ParseError
		if !errors.As(err, &pe) || err.Error() != want {
			t.Errorf("%q: got %v\nwant %s", in, err, want)
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
		err.Error() != "s:1:36: tool_calls: a compaction line is a summary: it cannot have tool_calls" {
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
	if err == nil || !strings.HasPrefix(err.Error(), `s:1:5: txt: unknown field`) {
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

// TestParseReportsEveryProblem (issue 28): a script with problems on
// several lines, and several on one line, is refused with every problem
// at once, in the order of the file, each at the column of the offending
// value (or key), with its field and a fix; a line cut off says so.
func TestParseReportsEveryProblem(t *testing.T) {
	in := `{"text": "Let me look.", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}
{"txt": "typo field", "chunk_delay": "50ms"}
// a comment, not counted as a reply but counted as a line
{"text": "bad json", "chunks": ["a" "b"]}
{"text": "b", "first_chunk_delay": 50, "tool_calls": [{"name": "fetch", "delay": "1s"}]}
  {"chunks": ["é", 7], "stall_after": "2", "error": {"status": 9, "retry_after": "soon"}}
{"text": "done", "chunk_delay": "50ms", "stall_after": `
	want := strings.Join([]string{
		`s.jsonl:2:2: txt: unknown field (did you mean text?)`,
		`s.jsonl:4:37: chunks: invalid character '"' after array element (a comma or ] is missing before it)`,
		`s.jsonl:5:36: first_chunk_delay: 50 is not a duration (a duration is a string like "50ms")`,
		`s.jsonl:5:73: tool_calls[0].delay: unknown field (the fields of a call in tool_calls are arguments, name)`,
		`s.jsonl:6:20: chunks[1]: 7 is not a string (put it in quotes: "7")`,
		`s.jsonl:6:39: stall_after: "2" is not a whole number (write it without quotes: 2)`,
		`s.jsonl:6:82: error.retry_after: "soon" is not a duration (use Go syntax like "50ms" or "2s")`,
		`s.jsonl:7:55: stall_after: the line ends before its JSON value does — is it cut off?`,
	}, "\n")
	_, err := script.Parse(strings.NewReader(in), "s.jsonl")
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	var list script.ParseErrors
	if !errors.As(err, &list) || len(list) != 8 || list[1].Line != 4 || list[1].Col != 37 || list[1].Key != "chunks" {
		t.Fatalf("not the problems as values: %#v", list)
	}
	// Once the types are right, the rules between fields are checked,
	// all of them.
	_, err = script.Parse(strings.NewReader(`{"text": "a", "chunks": ["b"], "stall_after": -1, "compaction": true, "tool_calls": [{"name": ""}], "error": {"status": 9}}`), "s")
	want = strings.Join([]string{
		`s:1:25: chunks: give text or chunks, not both`,
		`s:1:47: stall_after: -1 is negative (give a number of chunks, 0 or more)`,
		`s:1:85: tool_calls: a compaction line is a summary: it cannot have tool_calls`,
		`s:1:95: tool_calls[0].name: a call needs the name of its tool (such as "name": "search")`,
		`s:1:121: error.status: 9 is not an HTTP status (give 100 to 599, or 0 for a connection failure)`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}

// TestCutOffLine: a line whose JSON ends early is said to be cut off, at
// the column where it ends and in the field it was in, never as the
// decoder's "unexpected EOF".
func TestCutOffLine(t *testing.T) {
	for in, want := range map[string]string{
		`{"text": "done", "stall_after": `: `s:1:32: stall_after: the line ends before`,
		`{"text": "a"`:                     `s:1:13: the line ends before`,
		`{"chunks": ["a", "b`:              `s:1:20: chunks: the line ends before`,
		`{"tool_calls": [{"name": "x", "arguments": {"q": "é`:           `s:1:52: tool_calls[0].arguments.q: the line ends before`,
		"{\"text\": \"a\"}\n  {\"error\": {\"status\": 5":               `s:2:25: error.status: the line ends before`,
		`{"tool_calls": [{"name": "x"}, {"name": "y", "arguments": tru`: `s:1:62: tool_calls[1].arguments: the line ends before`,
	} {
		_, err := script.Parse(strings.NewReader(in), "s")
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "— is it cut off?") {
			t.Errorf("%s: got %v\nwant %s… — is it cut off?", in, err, want)
		}
	}
}

// TestWrongValuesNameTheFieldAndTheFix: a value of the wrong type is
// placed at the value, under its field, with how to write it.
func TestWrongValuesNameTheFieldAndTheFix(t *testing.T) {
	for in, want := range map[string]string{
		`{"chunk_delay": 0.5}`:                       `s:1:17: chunk_delay: 0.5 is not a duration (a duration is a string like "50ms")`,
		`{"chunk_delay": "-1s"}`:                     `s:1:17: chunk_delay: "-1s" is negative (give 0 or more, like "50ms")`,
		`{"chunk_delay": {"ms": 50}}`:                `s:1:17: chunk_delay: expected a duration, found an object`,
		`{"compaction": "true"}`:                     `s:1:16: compaction: "true" is not a boolean (write it without quotes: true)`,
		`{"compaction": 1}`:                          `s:1:16: compaction: 1 is not a boolean (give true or false)`,
		`{"stall_after": 2.5}`:                       `s:1:17: stall_after: 2.5 is not a whole number (give a whole number)`,
		`{"stall_after": 2.0}`:                       `s:1:17: stall_after: 2.0 is not a whole number (write 2)`,
		`{"stall_after": 99999999999999999999}`:      `s:1:17: stall_after: 99999999999999999999 is too large`,
		`{"chunks": "ab"}`:                           `s:1:12: chunks: expected a list of strings, found a string (such as ["Hel", "lo"])`,
		`{"tool_calls": {"name": "x"}}`:              `s:1:16: tool_calls: expected a list of calls, found an object (such as [{"name": "search", "arguments": {}}], even for one call)`,
		`{"tool_calls": ["search"]}`:                 `s:1:17: tool_calls[0]: expected a call, found a string (a call is an object, such as {"name": "search", "arguments": {}})`,
		`{"error": 503}`:                             `s:1:11: error: expected an object, found a number (such as {"status": 503, "message": "overloaded"})`,
		`["a"]`:                                      `s:1:1: the line is a list, not an object (each line is one JSON object, such as {"text": "Hello"})`,
		`{"status": 503}`:                            `s:1:2: status: unknown field (status is a field of error, not of the line)`,
		`{"tool_calls": [{"name": "x", "text": 1}]}`: `s:1:31: tool_calls[0].text: unknown field (text is a field of the line, not of tool_calls[0])`,
		`{"text": "a"}}`:                             `s:1:14: one JSON object per line, found more after it`,
		`{'text': 'a'}`:                              `s:1:2: invalid character '\'' looking for beginning of object key string (JSON strings are in double quotes)`,
		`{"text" "a"}`:                               `s:1:9: text: invalid character '"' after object key (a colon is missing after the key)`,
		`{"text": }`:                                 `s:1:10: text: invalid character '}' looking for beginning of value (the value is missing after the colon)`,
		`{"text": hello}`:                            `s:1:10: text: invalid character 'h' looking for beginning of value (a string is in double quotes, such as "hello")`,
		`{"chunks": ["a",]}`:                         `s:1:17: chunks: invalid character ']' looking for beginning of value (remove the comma before it: JSON allows none after the last item)`,
		`{"text": "a" "chunks": []}`:                 `s:1:14: invalid character '"' after object key:value pair (a comma or } is missing before it)`,
	} {
		_, err := script.Parse(strings.NewReader(in), "s")
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v\nwant %s", in, err, want)
		}
	}
	// As encoding/json reads them: null is the zero value, and a key
	// matches its field whatever its case.
	ls, err := script.Parse(strings.NewReader(`{"Text": "a", "chunk_delay": null, "stall_after": null, "tool_calls": null}`), "s")
	if err != nil || ls[0].Text != "a" || ls[0].StallAfter != nil {
		t.Fatalf("got %+v, %v", ls, err)
	}
}

// TestUnknownTools: each call of the script to a tool the agent lacks is
// named at the call's name, with the agent's tools (what timebox
// validate warns about).
func TestUnknownTools(t *testing.T) {
	ls, err := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "search"}, {"name": "fetch"}]}
// calls a tool the agent lacks, on purpose or not
{"text": "x", "tool_calls": [{"arguments": {}, "name": "serch"}, {"name": "report"}]}`), "s.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if at := ls[1].ToolCalls[0].At; at != (script.Pos{File: "s.jsonl", Line: 3, Col: 56}) {
		t.Errorf("the call is at %+v", at)
	}
	got := script.UnknownTools(ls, []string{"search", "fetch"}).Error()
	want := `s.jsonl:3:56: tool_calls[0].name: "serch" is not a tool of this agent (did you mean search? its tools: search, fetch)
s.jsonl:3:75: tool_calls[1].name: "report" is not a tool of this agent (its tools: search, fetch)`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := script.UnknownTools(ls[:1], nil).Error(); !strings.HasSuffix(got, `"fetch" is not a tool of this agent (it has no tools)`) {
		t.Errorf("got %s", got)
	}
	if got := script.UnknownTools(ls, []string{"search", "fetch", "serch", "report"}); len(got) != 0 {
		t.Errorf("got %v", got)
	}
}

// TestExpectInRequest: a line's expect_in_request fails the call it
// answers, as a provider's 400 naming the text, when the request does not
// contain every text, wherever it is in what the model is sent.
func TestExpectInRequest(t *testing.T) {
	lines, err := script.Parse(strings.NewReader(`{"text": "ok", "expect_in_request": ["Times out after 10s", "Tool calls left: 50 of 50"]}`), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(lines)
	if err != nil {
		t.Fatal(err)
	}
	req := model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}},
		Tools:    []model.ToolDef{{Name: "look", Description: "Looks. Times out after 10s."}},
		TimeNote: "[timebox] Tool calls left: 50 of 50."}
	s, err := p.Stream(t.Context(), req)
	if err != nil {
		t.Fatalf("every text is there: %v", err)
	}
	s.Close()
	req.TimeNote = ""
	_, err = p.Stream(t.Context(), req)
	var me *model.Error
	if !errors.As(err, &me) || me.Status != 400 ||
		me.Message != `script line 1: expect_in_request: the request does not contain "Tool calls left: 50 of 50"` {
		t.Fatalf("err = %v, want a 400 naming the missing text", err)
	}
}
