package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/tool"
)

// whsec is the receivers' secret, as a person sets it in the variable
// secret_env names; whKey the key it holds.
var (
	whKey = []byte("timebox-webhook-test-key-32bytes")
	whsec = "whsec_" + base64.StdEncoding.EncodeToString(whKey)
)

// hit is one request a receiver got.
type hit struct {
	id, ts, sig string
	body        []byte
	hdr         http.Header
	status      int
}

// receiver is a real HTTP receiver of webhooks: answer decides each
// request's status (n counts from 1); it may block until the request's
// context ends.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	hits []hit
	// open has the arrival of each request whose handler has not
	// returned; maxIn is the most of them that arrived within
	// recentWithin of one another.
	open  map[int]time.Time
	maxIn int
}

// recentWithin: a sender gives up on a request at its timeout (200ms in
// TestWebhookReceiverHangs), but the receiver learns of it only when it
// reads the closed connection, a moment later. Requests that arrived more
// than this long before another are not counted as held with it.
const recentWithin = 150 * time.Millisecond

func newReceiver(t *testing.T, answer func(r *http.Request, n int) int) *receiver {
	t.Helper()
	rc := &receiver{open: map[int]time.Time{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		n := len(rc.hits) + 1
		now := time.Now()
		rc.open[n] = now
		held := 0
		for _, at := range rc.open {
			if now.Sub(at) < recentWithin {
				held++
			}
		}
		rc.maxIn = max(rc.maxIn, held)
		rc.hits = append(rc.hits, hit{id: r.Header.Get("webhook-id"), ts: r.Header.Get("webhook-timestamp"),
			sig: r.Header.Get("webhook-signature"), body: body, hdr: r.Header.Clone()})
		rc.mu.Unlock()
		status := answer(r, n)
		rc.mu.Lock()
		delete(rc.open, n)
		rc.hits[n-1].status = status
		rc.mu.Unlock()
		if status > 0 {
			w.WriteHeader(status)
		}
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) got() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

// eventually polls cond every 10ms for up to 20s: no blind sleeps.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func deliveries(t *testing.T, e *env, query string) []store.Delivery {
	t.Helper()
	return decode[server.DeliveryList](t, e.do("GET", "/v1/webhooks/deliveries"+query, nil), http.StatusOK).Deliveries
}

func hook(url string, types ...event.Type) server.Webhook {
	h := server.Webhook{URL: url, Secret: whKey}
	for _, t := range types {
		h.Events = append(h.Events, server.WebhookEvent{Type: t})
	}
	return h
}

// verify checks a request's signature with the Standard Webhooks library,
// timestamp tolerance included.
func verifyHit(t *testing.T, h hit) {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(whsec)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(h.body, h.hdr); err != nil {
		t.Errorf("the Standard Webhooks library refuses delivery %s: %v (signature %q)", h.id, err, h.sig)
	}
	// And a signature over anything else does not verify.
	if err := wh.Verify(append(h.body, ' '), h.hdr); err == nil {
		t.Errorf("a changed body verifies")
	}
	// docs/webhooks.md's verifier by hand agrees.
	if !verify(whsec, h.hdr, h.body) || verify(whsec, h.hdr, append(h.body, ' ')) {
		t.Errorf("docs/webhooks.md's Go verifier disagrees with the library on %s", h.id)
	}
}

// TestWebhookSignedRetriedDeliveredOnce: a receiver that answers 500
// twice gets the event a third time, with the same webhook-id, each
// signed as the Standard Webhooks library verifies; then it is delivered
// and never sent again; its attempts are listed and counted.
func TestWebhookSignedRetriedDeliveredOnce(t *testing.T) {
	rc := newReceiver(t, func(_ *http.Request, n int) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hello"}`)),
		Webhooks:       []server.Webhook{hook(rc.URL+"/hook", event.TypeTurnFinished)},
		WebhookOptions: server.WebhookOptions{Retries: []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}, Poll: 10 * time.Millisecond}})

	rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hi"}), http.StatusOK)
	eventually(t, "a delivered delivery", func() bool {
		ds := deliveries(t, e, "?state=delivered")
		return len(ds) == 1
	})
	// Three polls more: nothing else is sent.
	time.Sleep(50 * time.Millisecond)
	hits := rc.got()
	if len(hits) != 3 {
		t.Fatalf("the receiver got %d requests, want 3 (500, 500, 200)", len(hits))
	}
	for i, h := range hits {
		if h.id != hits[0].id || !strings.HasPrefix(h.id, "msg_") {
			t.Errorf("request %d has webhook-id %q, want %q on every attempt", i, h.id, hits[0].id)
		}
		if ts, err := strconv.ParseInt(h.ts, 10, 64); err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
			t.Errorf("webhook-timestamp %q is not now in Unix seconds", h.ts)
		}
		if h.hdr.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type %q", h.hdr.Get("Content-Type"))
		}
		verifyHit(t, h)
		var ev struct {
			Type   string `json:"type"`
			TurnID string `json:"turn_id"`
			Seq    int64  `json:"seq"`
			Status string `json:"status"`
			Answer string `json:"answer"`
		}
		if err := json.Unmarshal(h.body, &ev); err != nil || ev.Type != "turn_finished" || ev.TurnID != rec.TurnID || ev.Status != "completed" || ev.Answer != "hello" {
			t.Errorf("body %s (%v), want the turn's turn_finished event", h.body, err)
		}
	}
	if want := server.Sign(whKey, hits[2].id, hits[2].ts, hits[2].body); hits[2].sig != want {
		t.Errorf("signature %q, want %q", hits[2].sig, want)
	}

	ds := deliveries(t, e, "?turn_id="+rec.TurnID)
	if len(ds) != 1 {
		t.Fatalf("deliveries of the turn: %+v", ds)
	}
	d := ds[0]
	if d.ID != hits[0].id || d.State != store.DeliveryDelivered || d.EventType != "turn_finished" || d.URL != rc.URL+"/hook" || len(d.Attempts) != 3 {
		t.Fatalf("delivery %+v", d)
	}
	for i, want := range []int{500, 500, 200} {
		a := d.Attempts[i]
		if a.Status != want || (want == 500) == a.NextRetryAt.IsZero() || a.By == "" {
			t.Errorf("attempt %d: %+v, want status %d and a next retry after a 500", i, a, want)
		}
	}
	metrics := text(t, e.do("GET", "/metrics", nil))
	for _, want := range []string{`timebox_webhook_deliveries_total{outcome="delivered"} 1`, `timebox_webhook_deliveries_total{outcome="retry"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func text(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWebhookFilters: only the subscribed events are sent, and a
// tool_finished filter keeps only its outcomes.
func TestWebhookFilters(t *testing.T) {
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusNoContent })
	h := hook(rc.URL, event.TypeTurnStarted)
	h.Events = append(h.Events, server.WebhookEvent{Type: event.TypeToolFinished, Outcomes: []event.Outcome{event.OutcomeTimedOut}})
	fast := goTool("fast", budget.Hard, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil })
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"tool_calls": [{"name": "fast", "arguments": {}}]}`, `{"text": "done"}`), fast),
		Webhooks: []server.Webhook{h}, WebhookOptions: server.WebhookOptions{Poll: 10 * time.Millisecond}})
	decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hi"}), http.StatusOK)
	eventually(t, "turn_started delivered", func() bool { return len(deliveries(t, e, "?state=delivered")) == 1 })
	if ds := deliveries(t, e, ""); len(ds) != 1 || ds[0].EventType != "turn_started" {
		t.Fatalf("deliveries %+v: want turn_started only (the ok tool_finished is filtered out)", ds)
	}
}

// TestWebhookSurvivesRestart: a delivery that failed once is still due
// after its server stopped, and the next server over the same store file
// delivers it, with the same webhook-id.
func TestWebhookSurvivesRestart(t *testing.T) {
	var up sync.Mutex
	down := true
	rc := newReceiver(t, func(*http.Request, int) int {
		up.Lock()
		defer up.Unlock()
		if down {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	path := filepath.Join(t.TempDir(), "timebox.db")
	open := func() store.Store {
		st, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	hooks := []server.Webhook{hook(rc.URL, event.TypeTurnFinished)}
	// The first server's retry is an hour away: it stops before it.
	a := newEnv(t, server.Config{Store: open(), Agent: newAgent(t, scripted(t, `{"text": "hello"}`)), Webhooks: hooks,
		WebhookOptions: server.WebhookOptions{Retries: []time.Duration{time.Hour}, Poll: 10 * time.Millisecond}})
	decode[rawRecord](t, a.do("POST", "/v1/turns", map[string]any{"input": "hi"}), http.StatusOK)
	eventually(t, "the first attempt recorded", func() bool {
		ds := deliveries(t, a, "")
		return len(ds) == 1 && len(ds[0].Attempts) == 1
	})
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	a.st.Close()
	up.Lock()
	down = false
	up.Unlock()

	// The second server's clock is two hours on: the retry is due.
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	b := newEnv(t, server.Config{Store: open(), Agent: newAgent(t, scripted(t, `{"text": "unused"}`)), Webhooks: hooks,
		WebhookOptions: server.WebhookOptions{Retries: []time.Duration{time.Hour}, Poll: 10 * time.Millisecond, Now: later}})
	eventually(t, "delivered after the restart", func() bool { return len(deliveries(t, b, "?state=delivered")) == 1 })
	hits := rc.got()
	if len(hits) != 2 || hits[0].id != hits[1].id || hits[0].status != 503 || hits[1].status != 200 {
		t.Fatalf("receiver got %+v, want one 503 then one 200 of the same webhook-id", hits)
	}
	d := deliveries(t, b, "")[0]
	if len(d.Attempts) != 2 || d.Attempts[0].By == d.Attempts[1].By {
		t.Errorf("attempts %+v: want one by each server", d.Attempts)
	}
	// Its signature is of the second server's time (two hours on, which
	// the library's 5-minute tolerance refuses): check it without.
	wh, _ := standardwebhooks.NewWebhook(whsec)
	if err := wh.VerifyIgnoringTimestamp(hits[1].body, hits[1].hdr); err != nil {
		t.Errorf("signature after the restart: %v", err)
	}
}

// TestWebhookReceiverHangs: a receiver that never answers costs each
// attempt its timeout, holds at most Senders requests at once, and never
// slows a turn; its deliveries are given up after their attempts.
func TestWebhookReceiverHangs(t *testing.T) {
	rc := newReceiver(t, func(r *http.Request, _ int) int {
		<-r.Context().Done() // until timebox gives up on it
		return 0
	})
	const turns = 6
	var lines []string
	for range turns {
		lines = append(lines, `{"text": "fine"}`)
	}
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, lines...)),
		Webhooks: []server.Webhook{hook(rc.URL, event.TypeTurnStarted, event.TypeTurnFinished)},
		WebhookOptions: server.WebhookOptions{Timeout: 200 * time.Millisecond, Retries: []time.Duration{10 * time.Millisecond},
			Senders: 2, Poll: 10 * time.Millisecond}})
	for i := range turns {
		start := time.Now()
		rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hi"}), http.StatusOK)
		if took := time.Since(start); rec.Status != budget.StatusCompleted || took > 2*time.Second {
			t.Fatalf("turn %d: %s after %s while the receiver hangs", i, rec.Status, took)
		}
	}
	eventually(t, "every delivery given up", func() bool { return len(deliveries(t, e, "?state=failed")) == 2*turns })
	for _, d := range deliveries(t, e, "") {
		if len(d.Attempts) != 2 || !strings.Contains(d.Attempts[0].Error, "no answer within 200ms") || !strings.Contains(d.Attempts[1].Error, "given up after 2 attempts") {
			t.Fatalf("delivery %+v", d)
		}
	}
	rc.mu.Lock()
	maxIn := rc.maxIn
	rc.mu.Unlock()
	if maxIn > 2 {
		t.Errorf("the receiver held %d requests at once; Senders is 2", maxIn)
	}
	if !strings.Contains(text(t, e.do("GET", "/metrics", nil)), `timebox_webhook_deliveries_total{outcome="failed"} 12`) {
		t.Errorf("/metrics does not count 12 failed deliveries")
	}
}

// TestWebhookTwoGatewaysDeliverOnce: two gateways on one PostgreSQL
// database, each with the webhook: every event is delivered once, whichever
// gateway ran its turn, while both look for due deliveries.
func TestWebhookTwoGatewaysDeliverOnce(t *testing.T) {
	dsn := testenv.Postgres(t)
	open := func() store.Store {
		st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	rc := newReceiver(t, func(*http.Request, int) int {
		time.Sleep(5 * time.Millisecond)
		return http.StatusOK
	})
	const turns = 8
	var lines []string
	for range turns {
		lines = append(lines, `{"text": "fine"}`)
	}
	o := server.WebhookOptions{Poll: 5 * time.Millisecond}
	hooks := []server.Webhook{hook(rc.URL, event.TypeTurnStarted, event.TypeTurnFinished)}
	a := newEnv(t, server.Config{Store: open(), Agent: newAgent(t, scripted(t, lines...)), Webhooks: hooks, WebhookOptions: o})
	b := newEnv(t, server.Config{Store: open(), Agent: newAgent(t, scripted(t, lines...)), Webhooks: hooks, WebhookOptions: o})
	var wg sync.WaitGroup
	for i := range turns {
		wg.Go(func() {
			e := a
			if i%2 == 1 {
				e = b
			}
			resp, err := e.doCtx(context.Background(), "POST", "/v1/turns", `{"input": "hi"}`)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	eventually(t, "every delivery delivered", func() bool { return len(deliveries(t, b, "?state=delivered")) == 2*turns })
	time.Sleep(50 * time.Millisecond) // ten polls of each: nothing more is sent
	seen := map[string]int{}
	for _, h := range rc.got() {
		seen[h.id]++
		verifyHit(t, h)
	}
	if len(seen) != 2*turns {
		t.Errorf("%d distinct deliveries received, want %d", len(seen), 2*turns)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s received %d times", id, n)
		}
	}
	by := map[string]int{}
	for _, d := range deliveries(t, a, "") {
		by[d.Attempts[0].By]++
	}
	t.Logf("deliveries of the turns by gateway: %v", by)

	// Deliveries neither gateway stored, so neither was woken for them:
	// both find them by polling, at once, and each is sent once.
	third := open()
	defer third.Close()
	const more = 60
	var ds []store.Delivery
	now := time.Now()
	for i := range more {
		ds = append(ds, store.Delivery{ID: "msg_polled" + strconv.Itoa(i), URL: rc.URL, EventType: "turn_finished",
			Body: []byte(`{"type":"turn_finished"}`), CreatedAt: now, NextAttemptAt: now})
	}
	if err := third.(store.Deliveries).EnqueueDeliveries(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the polled deliveries delivered", func() bool {
		return len(deliveries(t, b, "?state=delivered&limit=1000")) == 2*turns+more
	})
	time.Sleep(50 * time.Millisecond)
	seen = map[string]int{}
	for _, h := range rc.got() {
		seen[h.id]++
	}
	for i := range more {
		if n := seen["msg_polled"+strconv.Itoa(i)]; n != 1 {
			t.Errorf("msg_polled%d received %d times", i, n)
		}
	}
	by = map[string]int{}
	for _, d := range deliveries(t, a, "?limit=1000") {
		if strings.HasPrefix(d.ID, "msg_polled") {
			by[d.Attempts[0].By]++
		}
	}
	t.Logf("polled deliveries by gateway: %v", by)
}

func TestWebhookURLPointsAtServer(t *testing.T) {
	for _, tc := range []struct {
		url, addr string
		refused   bool
	}{
		{"http://127.0.0.1:8080/hook", "127.0.0.1:8080", true},
		{"http://localhost:8080/hook", "127.0.0.1:8080", true},
		{"http://[::1]:8080/hook", "0.0.0.0:8080", true},
		{"http://127.0.0.1:8080/hook", ":8080", true},
		{"https://10.0.0.5/hook", "10.0.0.5:443", true},
		{"http://127.0.0.1:9090/hook", "127.0.0.1:8080", false},
		{"https://hooks.example.com/x", "127.0.0.1:443", false},
		{"http://10.0.0.5:8080/hook", "127.0.0.1:8080", false},
	} {
		err := server.CheckWebhooks([]server.Webhook{hook(tc.url, event.TypeTurnFinished)}, tc.addr)
		if (err != nil) != tc.refused {
			t.Errorf("%s on %s: %v, refused want %v", tc.url, tc.addr, err, tc.refused)
		}
	}
	// Serve refuses to start with one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Agent: newAgent(t, scripted(t, `{"text": "x"}`)), Store: store.NewMemory(),
		Webhooks: []server.Webhook{hook("http://"+ln.Addr().String()+"/v1/turns", event.TypeTurnFinished)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), "points at this timebox server") {
		t.Fatalf("Serve: %v", err)
	}
	// New refuses another scheme.
	if _, err := server.New(server.Config{Agent: newAgent(t, scripted(t, `{"text": "x"}`)), Store: store.NewMemory(),
		Webhooks: []server.Webhook{hook("file:///etc/passwd", event.TypeTurnFinished)}}); err == nil {
		t.Fatal("New took a file: webhook")
	}
}

// TestDocsWebhooks: the verifiers docs/webhooks.md gives in Python and
// JavaScript accept a signature of the server's and refuse a changed body.
func TestDocsWebhooks(t *testing.T) {
	doc, err := os.ReadFile("../docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		_, rest, ok := strings.Cut(string(doc), "```"+lang+"\n")
		if !ok {
			t.Fatalf("docs/webhooks.md has no %s block", lang)
		}
		code, _, _ := strings.Cut(rest, "```")
		return code
	}
	// The Go verifier is verify, in webhooks_doc_test.go, word for word.
	src, err := os.ReadFile("webhooks_doc_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), block("go")) {
		t.Errorf("docs/webhooks.md's Go verifier is not webhooks_doc_test.go's verify: copy one to the other")
	}
	id, ts := "msg_docs", strconv.FormatInt(time.Now().Unix(), 10)
	body := `{"type":"turn_finished","answer":"ünïcode"}`
	sig := server.Sign(whKey, id, ts, []byte(body))
	hdrs, _ := json.Marshal(map[string]string{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": "v1,bm9wZQ== " + sig})
	for _, tc := range []struct{ lang, prog, harness string }{
		{"python", "python3", "\nimport json, sys\nh = json.loads(sys.argv[1])\nprint(verify(sys.argv[3], h, sys.argv[2].encode()), verify(sys.argv[3], h, sys.argv[2].encode() + b' '))\n"},
		{"js", "node", "\nconst [h, b, s] = process.argv.slice(-3);\nconsole.log(verify(s, JSON.parse(h), Buffer.from(b)), verify(s, JSON.parse(h), Buffer.from(b + ' ')));\n"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			path, err := exec.LookPath(tc.prog)
			if err != nil {
				t.Skipf("no %s to run the %s verifier", tc.prog, tc.lang)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			flag := map[string]string{"python": "-c", "js": "-e"}[tc.lang]
			out, err := exec.CommandContext(ctx, path, flag, block(tc.lang)+tc.harness, string(hdrs), body, whsec).CombinedOutput()
			got := strings.ToLower(strings.TrimSpace(string(out)))
			if err != nil || got != "true false" {
				t.Fatalf("the %s verifier said %q (%v), want true for the signed body and false for a changed one", tc.lang, out, err)
			}
		})
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestWebhookScheduleOnAFakeClock: each retry is due its wait after the
// attempt before it, by the schedule's clock — an hour, then two, pass in
// no time — and the delivery is given up after the last; one older than
// MaxAge is given up without an attempt.
func TestWebhookScheduleOnAFakeClock(t *testing.T) {
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusBadGateway })
	clock := &fakeClock{now: time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)}
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "one"}`, `{"text": "two"}`)),
		Webhooks: []server.Webhook{hook(rc.URL, event.TypeTurnFinished)},
		WebhookOptions: server.WebhookOptions{Retries: []time.Duration{time.Hour, 2 * time.Hour}, MaxAge: 24 * time.Hour,
			Poll: 5 * time.Millisecond, Now: clock.Now}})
	first := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hi"}), http.StatusOK)
	attempts := func(turn string) []store.DeliveryAttempt {
		ds := deliveries(t, e, "?turn_id="+turn)
		if len(ds) != 1 {
			return nil
		}
		return ds[0].Attempts
	}
	start := clock.Now()
	eventually(t, "the first attempt", func() bool { return len(attempts(first.TurnID)) == 1 })
	if a := attempts(first.TurnID)[0]; a.Status != 502 || !a.NextRetryAt.Equal(start.Add(time.Hour)) {
		t.Fatalf("first attempt %+v, want 502 and a retry an hour on", a)
	}
	clock.advance(59 * time.Minute)
	time.Sleep(30 * time.Millisecond) // six polls: nothing is due
	if n := len(rc.got()); n != 1 {
		t.Fatalf("%d requests before the retry was due", n)
	}
	clock.advance(time.Minute)
	eventually(t, "the second attempt", func() bool { return len(attempts(first.TurnID)) == 2 })
	if a := attempts(first.TurnID)[1]; !a.NextRetryAt.Equal(start.Add(3 * time.Hour)) {
		t.Fatalf("second attempt %+v, want a retry two hours on", a)
	}
	clock.advance(2 * time.Hour)
	eventually(t, "the last attempt", func() bool { return len(deliveries(t, e, "?state=failed")) == 1 })
	if a := attempts(first.TurnID)[2]; !a.NextRetryAt.IsZero() || !strings.Contains(a.Error, "given up after 3 attempts") {
		t.Fatalf("last attempt %+v", a)
	}

	// A delivery that waits past MaxAge is given up at its next attempt.
	second := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "again"}), http.StatusOK)
	eventually(t, "its first attempt", func() bool { return len(attempts(second.TurnID)) == 1 })
	clock.advance(25 * time.Hour)
	eventually(t, "given up as too old", func() bool { return len(deliveries(t, e, "?state=failed")) == 2 })
	if a := attempts(second.TurnID); len(a) != 2 || a[1].Status != 0 || !strings.Contains(a[1].Error, "older than 24h0m0s") {
		t.Fatalf("attempts %+v", a)
	}
	if n := len(rc.got()); n != 4 {
		t.Errorf("the receiver got %d requests, want 4 (three of the first, one of the second)", n)
	}

	// A week on, the next hourly pruning deletes them both.
	clock.advance(7 * 24 * time.Hour)
	eventually(t, "old deliveries deleted", func() bool { return len(deliveries(t, e, "")) == 0 })
}
