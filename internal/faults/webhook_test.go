//go:build faults && linux

package faults

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/procmem"
)

// TestWebhookFaults runs `timebox serve` with a webhook whose receiver
// hangs, then with one that is down across a restart of serve: turns are
// not slowed, memory and connections stay bounded, and every event is
// delivered once the receiver is back (docs/webhooks.md).
func TestWebhookFaults(t *testing.T) {
	t.Run("receiver hangs", webhookReceiverHangs)
	t.Run("receiver down across a restart", webhookReceiverDown)
	t.Run("PostgreSQL restarted under two gateways", webhooksAcrossRestarts)
}

var faultsWhsec = "whsec_" + base64.StdEncoding.EncodeToString([]byte("faults-webhook-key-of-32-bytes!!"))

// hookReceiver is a receiver of webhooks in the test's process: while
// hang is set it holds each request until timebox gives up on it;
// otherwise it answers 200. It counts requests in flight and the 2xx
// answers of each webhook-id.
type hookReceiver struct {
	mu       sync.Mutex
	hang     bool
	inFlight int
	maxIn    int
	requests int
	ok       map[string]int
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	id := r.Header.Get("webhook-id")
	h.mu.Lock()
	h.requests++
	h.inFlight++
	h.maxIn = max(h.maxIn, h.inFlight)
	hang := h.hang
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight--
		h.mu.Unlock()
	}()
	if hang {
		<-r.Context().Done()
		return
	}
	h.mu.Lock()
	h.ok[id]++
	h.mu.Unlock()
}

func (h *hookReceiver) stats() (requests, maxIn int, ok map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := map[string]int{}
	for k, v := range h.ok {
		m[k] = v
	}
	return h.requests, h.maxIn, m
}

// hookAgent is an agent answering n turns at once, whose server sends
// turn_started and turn_finished to url.
func hookAgent(t *testing.T, url string, n int) agentDir {
	t.Helper()
	y := "name: faults\nmodel: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n" +
		"server:\n  webhooks:\n    - {url: " + url + ", events: [turn_started, turn_finished], secret_env: HOOK_SECRET}\n"
	lines := make([]string, n)
	for i := range lines {
		lines[i] = `{"text": "fine"}`
	}
	return newAgent(t, y, lines, nil)
}

// plainTurn posts a turn for its JSON record and returns how long it took.
func plainTurn(t *testing.T, url string) (time.Duration, string) {
	t.Helper()
	start := time.Now()
	resp, err := http.Post(url+"/v1/turns", "application/json", strings.NewReader(`{"input": "hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rec struct {
		Status string `json:"status"`
	}
	json.NewDecoder(resp.Body).Decode(&rec)
	return time.Since(start), rec.Status
}

// deliveryStates counts a gateway's deliveries by state, and the attempts.
func deliveryStates(url string) (map[string]int, int) {
	resp, err := http.Get(url + "/v1/webhooks/deliveries?limit=1000")
	if err != nil {
		return nil, 0
	}
	defer resp.Body.Close()
	var list struct {
		Deliveries []struct {
			State    string            `json:"state"`
			Attempts []json.RawMessage `json:"attempts"`
		} `json:"deliveries"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	by, attempts := map[string]int{}, 0
	for _, d := range list.Deliveries {
		by[d.State]++
		attempts += len(d.Attempts)
	}
	return by, attempts
}

// attemptsAtOnce is the most attempts of a gateway's deliveries that ran at
// once, from their records (each from its start for its duration).
func attemptsAtOnce(url string) int {
	resp, err := http.Get(url + "/v1/webhooks/deliveries?limit=1000")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var list struct {
		Deliveries []struct {
			Attempts []struct {
				At         time.Time `json:"at"`
				DurationMS int64     `json:"duration_ms"`
			} `json:"attempts"`
		} `json:"deliveries"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, d := range list.Deliveries {
		for _, a := range d.Attempts {
			edges = append(edges, edge{a.At, 1}, edge{a.At.Add(time.Duration(a.DurationMS) * time.Millisecond), -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // an end before a start at the same instant
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.d
		most = max(most, n)
	}
	return most
}

// webhookReceiverHangs: the receiver holds every request. Eight turns run
// as fast as without webhooks; at most 4 requests are open at once, each cut
// at 10 s; then the receiver answers, and all 16 events are delivered, each
// once.
func webhookReceiverHangs(t *testing.T) {
	sc := begin(t, "webhook receiver hangs, then answers", "timebox serve, server.webhooks to an HTTP receiver that holds each request")
	h := &hookReceiver{hang: true, ok: map[string]int{}}
	rc := httptest.NewServer(h)
	defer rc.Close()
	const turns = 8
	a := hookAgent(t, rc.URL+"/hook", turns)
	gw, url := startServe(t, a, []string{"HOOK_SECRET=" + faultsWhsec})

	var slowest time.Duration
	completed := 0
	for range turns {
		took, status := plainTurn(t, url)
		slowest = max(slowest, took)
		if status == "completed" {
			completed++
		}
	}
	sc.count("turns completed while the receiver hangs", completed, turns)
	sc.within("slowest turn's answer while the receiver hangs", slowest, time.Second)

	var cut int
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, cut = deliveryStates(url); cut >= 4 {
			break
		}
	}
	sc.truth("attempts cut at their 10 s timeout and recorded", "≥ 4", fmt.Sprint(cut), cut >= 4)
	sc.memory("peak memory of the gateway", procmem.Peak(gw.pid()), 150)

	h.mu.Lock()
	h.hang = false
	h.mu.Unlock()
	answered := time.Now()
	var by map[string]int
	for deadline := time.Now().Add(120 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if by, _ = deliveryStates(url); by["delivered"] == 2*turns {
			break
		}
	}
	sc.count("events delivered once the receiver answers", by["delivered"], 2*turns)
	sc.within("  the last of them after the receiver answered", time.Since(answered), 90*time.Second)
	_, _, ok := h.stats()
	twice := 0
	for _, n := range ok {
		if n > 1 {
			twice++
		}
	}
	sc.count("events answered 2xx more than once", twice, 0)
	sc.atMost("attempts in flight at once, from their records", attemptsAtOnce(url), 4)
	// The receiver sees a cut request end a moment after timebox has cut
	// it and started the next: its count may hold those too.
	_, maxIn, _ := h.stats()
	sc.atMost("requests the receiver held at once (in flight, and cut ones it had not yet seen closed)", maxIn, 8)
	stopGateways(t, gw)
	sc.nothingLeft(gw.pid())
}

// webhookReceiverDown: the receiver's port refuses connections; serve is
// stopped after the first attempts and started again over the same store
// once the receiver is up: every event is delivered, once, with the id it
// had.
func webhookReceiverDown(t *testing.T) {
	sc := begin(t, "webhook receiver down, serve restarted", "timebox serve ×2 in turn on one SQLite file, server.webhooks to a port nothing listens on, then a receiver")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there for now
	const turns = 4
	a := hookAgent(t, "http://"+addr+"/hook", turns)
	env := []string{"HOOK_SECRET=" + faultsWhsec}
	gw, url := startServe(t, a, env)
	for range turns {
		plainTurn(t, url)
	}
	var tried int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, tried = deliveryStates(url); tried >= 2*turns {
			break
		}
	}
	sc.truth("first attempts refused and recorded", fmt.Sprintf("≥ %d", 2*turns), fmt.Sprint(tried), tried >= 2*turns)
	stopGateways(t, gw)

	h := &hookReceiver{ok: map[string]int{}}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the receiver's port was taken meanwhile: %v", err)
	}
	rc := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	rc.Start()
	defer rc.Close()
	gw2, url2 := startServe(t, a, env)
	back := time.Now()
	var by map[string]int
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if by, _ = deliveryStates(url2); by["delivered"] == 2*turns {
			break
		}
	}
	sc.count("events delivered after the restart", by["delivered"], 2*turns)
	sc.within("  the last of them after the new serve started", time.Since(back), 15*time.Second)
	_, _, ok := h.stats()
	twice := 0
	for _, n := range ok {
		if n > 1 {
			twice++
		}
	}
	sc.count("distinct webhook-ids answered 2xx", len(ok), 2*turns)
	sc.count("events answered 2xx more than once", twice, 0)
	stopGateways(t, gw2)
	sc.nothingLeft(gw.pid(), gw2.pid())
}
