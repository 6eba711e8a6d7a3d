package server_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/http-api.md")

const (
	httpDoc   = "../docs/http-api.md"
	regenHTTP = "`go test ./server -run TestDocs -update`"
)

// routesPart is the route table of docs/http-api.md, made from the
// OpenAPI document.
func routesPart(t *testing.T) string {
	d := loadAPIDoc(t)
	ops := d.operations()
	keys := make([]string, 0, len(ops))
	for op := range ops {
		keys = append(keys, string(op))
	}
	// By path, POST before GET, the way a client meets them.
	sort.Slice(keys, func(i, j int) bool {
		mi, pi, _ := strings.Cut(keys[i], " ")
		mj, pj, _ := strings.Cut(keys[j], " ")
		if pi != pj {
			return pi < pj
		}
		return mi > mj
	})
	var b strings.Builder
	b.WriteString("| route | what | answers |\n|---|---|---|\n")
	for _, k := range keys {
		op := ops[operation(k)]
		statuses := slices.Sorted(func(yield func(string) bool) {
			for s := range op.Responses {
				if !yield(s) {
					return
				}
			}
		})
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k, op.Summary, strings.Join(statuses, ", "))
	}
	return b.String()
}

// filtersPart is the table of GET /v1/turns's query parameters.
func filtersPart(t *testing.T) string {
	op := loadAPIDoc(t).Paths["/v1/turns"]["get"]
	var b strings.Builder
	b.WriteString("| parameter | what it does |\n|---|---|\n")
	for _, p := range op.Parameters {
		desc := p.Description
		if enum, ok := p.Schema["enum"].([]any); ok {
			var vs []string
			for _, v := range enum {
				vs = append(vs, fmt.Sprintf("`%v`", v))
			}
			desc += " One of " + strings.Join(vs, ", ") + "."
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", p.Name, desc)
	}
	return b.String()
}

var turnIDRE = regexp.MustCompile(`t_[A-Z2-7]{26}`)

// streamPart is the event stream of a short scripted turn, as the server
// writes it, in synthetic time; only the random turn id is replaced.
func streamPart(t *testing.T) string {
	var text string
	synctest.Test(t, func(t *testing.T) {
		p := scripted(t, `{"chunks": ["Counting."], "first_chunk_delay": "450ms", "tool_calls": [{"name": "word_count", "arguments": {"text": "one two three"}}]}`,
			`{"text": "Three words.", "first_chunk_delay": "380ms", "chunk_delay": "60ms"}`)
		wc := goTool("word_count", budget.Cooperative, 5*time.Second, func(ctx context.Context, in json.RawMessage, pr tool.Progress) (any, error) {
			var v struct{ Text string }
			json.Unmarshal(in, &v)
			time.Sleep(12 * time.Millisecond)
			return map[string]int{"words": len(strings.Fields(v.Text))}, nil
		})
		a, err := agent.New(agent.Config{Name: "docs", Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}}, Tools: []agent.Tool{wc}})
		if err != nil {
			t.Fatal(err)
		}
		st := store.NewMemory()
		srv, err := server.New(server.Config{Agent: a, AgentName: "docs", Store: st})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		defer srv.Shutdown(context.Background())
		rec := serve(srv, "POST", "/v1/turns", `{"input": "How many words in: one two three?", "session_id": "s1"}`, "Accept", "text/event-stream")
		if rec.Code != 200 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		text = turnIDRE.ReplaceAllString(rec.Body.String(), "t_NBSWY3DPEB3W64TMMQQGC5LUN4")
	})
	return "```\n" + text + "```\n"
}

// TestDocsHTTPAPI: the generated parts of docs/http-api.md are what the
// OpenAPI document and a real turn say.
func TestDocsHTTPAPI(t *testing.T) {
	doctest.Part(t, httpDoc, "routes", routesPart(t), *update, regenHTTP)
	doctest.Part(t, httpDoc, "filters", filtersPart(t), *update, regenHTTP)
	doctest.Part(t, httpDoc, "stream", streamPart(t), *update, regenHTTP)
}

// TestDocsHTTPAPITables: the request body's table lists TurnRequest's
// fields, and the error table every code a handler writes.
func TestDocsHTTPAPITables(t *testing.T) {
	data, err := os.ReadFile(httpDoc)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	rowsOf := func(heading string) []string {
		_, text, ok := strings.Cut(page, "\n"+heading+"\n")
		if !ok {
			t.Fatalf("%s has no %q", httpDoc, heading)
		}
		text, _, _ = strings.Cut(text, "\n## ")
		var out []string
		for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(text, -1) {
			out = append(out, m[1])
		}
		sort.Strings(out)
		return slices.Compact(out)
	}
	if got, want := rowsOf("## Starting a turn"), jsonFields(reflect.TypeFor[server.TurnRequest]()); !slices.Equal(got, want) {
		t.Errorf("%s: the request body's table lists %q; server.TurnRequest has %q", httpDoc, got, want)
	}
	if got, want := rowsOf("## Errors"), errorCodes(t); !slices.Equal(got, want) {
		t.Errorf("%s: the error table lists %q; the handlers write %q", httpDoc, got, want)
	}
}
