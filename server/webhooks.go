package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/ids"
	"github.com/timebox-run/timebox/store"
)

// Webhook is one receiver of events (server.webhooks): each event it
// subscribes to is POSTed to URL, signed with Secret the Standard Webhooks
// way (docs/webhooks.md), at least once.
type Webhook struct {
	// URL is the receiver: http or https.
	URL string
	// Secret is the HMAC-SHA256 key: the bytes a whsec_ secret holds
	// after its prefix, base64-decoded (config.WebhookSecret).
	Secret []byte
	// Events are the event types sent, each with its filter.
	Events []WebhookEvent
}

// WebhookEvent is one event type a Webhook subscribes to.
type WebhookEvent struct {
	// Type is the event type sent.
	Type event.Type
	// Outcomes, for tool_finished, keeps only the calls that ended so;
	// empty sends every outcome.
	Outcomes []event.Outcome
}

// wants reports whether w subscribes to e.
func (w Webhook) wants(e event.Event) bool {
	var outcome event.Outcome
	if d, ok := e.Data.(*event.ToolFinished); ok {
		outcome = d.Outcome
	}
	for _, we := range w.Events {
		if we.Type == e.Type && (len(we.Outcomes) == 0 || slices.Contains(we.Outcomes, outcome)) {
			return true
		}
	}
	return false
}

// Defaults of WebhookOptions' zero fields.
const (
	DefaultWebhookTimeout = 10 * time.Second
	DefaultWebhookMaxAge  = 3 * 24 * time.Hour
	DefaultWebhookPoll    = time.Second
	DefaultWebhookSenders = 4
	DefaultWebhookKeep    = 7 * 24 * time.Hour
)

// DefaultWebhookRetries is the Standard Webhooks schedule: after the
// first attempt, again 5s, 5m, 30m, 2h, 5h, 10h and 10h later — eight
// attempts over about 28 hours.
var DefaultWebhookRetries = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// WebhookOptions tune the delivery of webhooks; the zero value is what
// `timebox serve` uses.
type WebhookOptions struct {
	// Timeout bounds one attempt: connecting, sending and the answer's
	// status. Zero is DefaultWebhookTimeout (10s).
	Timeout time.Duration
	// Retries are the waits before each attempt after the first: the
	// number of attempts is one more than its length. Nil is
	// DefaultWebhookRetries.
	Retries []time.Duration
	// MaxAge gives up a delivery still undelivered this long after its
	// event. Zero is DefaultWebhookMaxAge (3 days).
	MaxAge time.Duration
	// Poll is how often the store is asked for deliveries that are due
	// (new ones are sent at once by the gateway that stored them). Zero is
	// DefaultWebhookPoll (1s).
	Poll time.Duration
	// Senders bounds the attempts in flight at once, and so the memory
	// slow receivers cost: at most Senders bodies are held. Zero is
	// DefaultWebhookSenders (4).
	Senders int
	// Keep is how long a delivery that is no longer pending (delivered or
	// given up) is kept, for GET /v1/webhooks/deliveries; older ones are
	// deleted, once an hour. Zero is DefaultWebhookKeep (7 days).
	Keep time.Duration
	// Now is the clock of the retry schedule and of the signatures' time
	// stamps; nil is time.Now.
	Now func() time.Time
	// Client sends the POSTs; nil is a client that follows no redirects
	// (a receiver must answer at its URL).
	Client *http.Client
}

// Metric outcomes of timebox_webhook_deliveries_total.
const (
	webhookDelivered = "delivered" // answered 2xx
	webhookRetry     = "retry"     // an attempt failed; the delivery is due again later
	webhookFailed    = "failed"    // given up: out of attempts, too old, or no longer configured
	webhookNotStored = "not_stored"
)

// webhookQueue is how many deliveries may wait in memory for the store to
// take them: past it the turn that emits waits for room, as it does for
// its events (store.Store.QueueEvent) — only while the store is away.
const webhookQueue = 1024

// maxWebhookAnswer is how much of a receiver's answer is read (and
// dropped): enough to keep the connection for the next attempt.
const maxWebhookAnswer = 64 << 10

// webhooks delivers the server's webhooks: the turns' sinks offer each
// event; those a receiver subscribes to are stored as deliveries (by one
// writer goroutine, from a bounded queue, so that a turn never waits for
// the disk), then claimed from the store — by this gateway or another
// sharing it — and POSTed by at most Senders goroutines.
type webhooks struct {
	hooks []Webhook
	q     store.Deliveries
	o     WebhookOptions
	owner string
	m     *metrics
	log   *slog.Logger
	lease time.Duration

	in   chan store.Delivery
	kick chan struct{}
	// stop ends the claims and the attempts in flight; stopIn the writer
	// once it has stored what is queued; stopStore the writer's wait for a
	// store that is away, storeGrace after stopIn.
	stop      context.CancelFunc
	stopIn    chan struct{}
	stopStore context.CancelFunc
	transport *http.Transport // nil when Client was given
	wg        sync.WaitGroup
	stopOnce  sync.Once
}

func newWebhooks(hooks []Webhook, st store.Store, o WebhookOptions, m *metrics, log *slog.Logger) (*webhooks, error) {
	q, ok := st.(store.Deliveries)
	if !ok {
		return nil, fmt.Errorf("server: webhooks need a store that keeps deliveries (SQLite, PostgreSQL or Memory); %T does not", st)
	}
	for i, h := range hooks {
		if err := checkWebhookURL(h.URL); err != nil {
			return nil, fmt.Errorf("server: webhook %d: %w", i, err)
		}
		if len(h.Secret) == 0 {
			return nil, fmt.Errorf("server: webhook %d (%s): no secret", i, h.URL)
		}
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultWebhookTimeout
	}
	if o.Retries == nil {
		o.Retries = DefaultWebhookRetries
	}
	o.Retries = slices.Clone(o.Retries)
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultWebhookMaxAge
	}
	if o.Poll <= 0 {
		o.Poll = DefaultWebhookPoll
	}
	if o.Senders <= 0 {
		o.Senders = DefaultWebhookSenders
	}
	if o.Keep <= 0 {
		o.Keep = DefaultWebhookKeep
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var transport *http.Transport
	if o.Client == nil {
		transport = http.DefaultTransport.(*http.Transport).Clone()
		o.Client = &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	owner := ids.New("gw_")
	if ow, ok := st.(store.Owned); ok {
		owner = ow.Owner()
	}
	w := &webhooks{hooks: slices.Clone(hooks), q: q, o: o, owner: owner, m: m, log: log,
		// An attempt holds its lease for its timeout and the time to
		// record it: another gateway takes the delivery only once the
		// holder is surely done with it (or gone).
		lease: o.Timeout + 30*time.Second,
		in:    make(chan store.Delivery, webhookQueue), kick: make(chan struct{}, 1), stopIn: make(chan struct{}), transport: transport}
	var sendCtx, storeCtx context.Context
	sendCtx, w.stop = context.WithCancel(context.Background())
	storeCtx, w.stopStore = context.WithCancel(context.Background())
	w.wg.Add(2)
	go w.write(storeCtx)
	go w.send(sendCtx)
	return w, nil
}

// messageID is a delivery's id (webhook-id): the same for one event and
// one receiver whoever computes it, so that storing it twice stores it
// once.
func messageID(url string, e event.Event) string {
	h := sha256.Sum256([]byte(url + "\x00" + e.TurnID + "\x00" + strconv.FormatInt(e.Seq, 10) + "\x00" + string(e.Type)))
	return "msg_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:16]))
}

// offer queues a delivery of e, already encoded as data, for each receiver
// that subscribes to it. It waits only when webhookQueue deliveries are
// waiting for the store.
func (w *webhooks) offer(e event.Event, data []byte) {
	for _, h := range w.hooks {
		if !h.wants(e) {
			continue
		}
		now := w.o.Now()
		d := store.Delivery{ID: messageID(h.URL, e), URL: h.URL, EventType: string(e.Type), TurnID: e.TurnID, Seq: e.Seq,
			Body: data, CreatedAt: now, NextAttemptAt: now}
		select {
		case <-w.stopIn:
			// A turn that outlived the shutdown's wait (Shutdown's error
			// says so): the writer has stopped.
			w.m.webhooks.WithLabelValues(webhookNotStored).Inc()
			w.log.Error("webhook delivery not stored: the server has stopped", "id", d.ID, "turn_id", d.TurnID, "type", d.EventType)
			continue
		default:
		}
		select {
		case w.in <- d:
		case <-w.stopIn:
			w.m.webhooks.WithLabelValues(webhookNotStored).Inc()
			w.log.Error("webhook delivery not stored: the server has stopped", "id", d.ID, "turn_id", d.TurnID, "type", d.EventType)
		}
	}
}

// write stores the queued deliveries, in batches, and wakes the senders;
// ctx ends its wait for a store that is away.
func (w *webhooks) write(ctx context.Context) {
	defer w.wg.Done()
	batch := make([]store.Delivery, 0, 256)
	store1 := func() {
		// SQLite and PostgreSQL try again while their database is away,
		// until it is back or the shutdown's grace for it ends
		// (ctx); an error that does not pass fails at once.
		if err := w.q.EnqueueDeliveries(ctx, batch); err != nil {
			w.m.webhooks.WithLabelValues(webhookNotStored).Add(float64(len(batch)))
			w.m.storeErrors.WithLabelValues("enqueue_deliveries").Inc()
			w.log.Error("webhook deliveries not stored", "deliveries", len(batch), "err", err)
		}
		batch = batch[:0]
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	for {
		select {
		case d := <-w.in:
			batch = append(batch, d)
		more:
			for len(batch) < cap(batch) {
				select {
				case d := <-w.in:
					batch = append(batch, d)
				default:
					break more
				}
			}
			store1()
		case <-w.stopIn:
			// Offers have ended (the turns have): store what is left.
			for {
				select {
				case d := <-w.in:
					batch = append(batch, d)
					if len(batch) == cap(batch) {
						store1()
					}
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				store1()
			}
			return
		}
	}
}

// send claims due deliveries and runs their attempts, Senders at a time.
func (w *webhooks) send(ctx context.Context) {
	defer w.wg.Done()
	var flight sync.WaitGroup
	defer flight.Wait()
	slots := make(chan struct{}, w.o.Senders)
	t := time.NewTicker(w.o.Poll)
	defer t.Stop()
	var pruned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
		if now := w.o.Now(); now.Sub(pruned) >= pruneEvery {
			pruned = now
			if n, err := w.q.PruneDeliveries(ctx, now.Add(-w.o.Keep)); err != nil && ctx.Err() == nil {
				w.log.Warn("deleting old webhook deliveries", "err", err)
			} else if n > 0 {
				w.log.Info("deleted old webhook deliveries", "deliveries", n, "older_than", w.o.Keep)
			}
		}
		for ctx.Err() == nil {
			free := cap(slots) - len(slots)
			if free == 0 {
				break // a sender that ends kicks
			}
			ds, err := w.q.ClaimDeliveries(ctx, w.owner, w.o.Now(), w.lease, free)
			if err != nil {
				if ctx.Err() == nil {
					w.m.storeErrors.WithLabelValues("claim_deliveries").Inc()
					w.log.Warn("claiming webhook deliveries", "err", err)
				}
				break
			}
			for _, d := range ds {
				slots <- struct{}{}
				flight.Add(1)
				go func() {
					defer flight.Done()
					w.attempt(ctx, d)
					<-slots
					select {
					case w.kick <- struct{}{}:
					default:
					}
				}()
			}
			if len(ds) < free {
				break
			}
		}
	}
}

// attempt POSTs d once and records how it went.
func (w *webhooks) attempt(ctx context.Context, d store.Delivery) {
	now := w.o.Now()
	a := store.DeliveryAttempt{At: now, By: w.owner}
	state, next := store.DeliveryPending, time.Time{}
	hook, ok := w.hook(d.URL)
	switch {
	case !ok:
		a.Error = "no webhook of this server has this URL any more; given up"
		state = store.DeliveryFailed
	case now.Sub(d.CreatedAt) > w.o.MaxAge:
		a.Error = fmt.Sprintf("older than %s; given up", w.o.MaxAge)
		state = store.DeliveryFailed
	default:
		a.Status, a.Error = w.post(ctx, hook, d, now)
		a.DurationMS = w.o.Now().Sub(now).Milliseconds()
		switch {
		case a.Status >= 200 && a.Status < 300:
			state = store.DeliveryDelivered
		case ctx.Err() != nil:
			// Cut by a shutdown: due again at once, wherever it is claimed,
			// and not one of the attempts of the schedule.
			a.Error = cutByShutdown
			next = w.o.Now()
		case madeAttempts(d.Attempts) < len(w.o.Retries):
			next = w.o.Now().Add(w.o.Retries[madeAttempts(d.Attempts)])
			a.NextRetryAt = next
		default:
			state = store.DeliveryFailed
			a.Error += fmt.Sprintf("; given up after %d attempts", madeAttempts(d.Attempts)+1)
		}
	}
	outcome := map[store.DeliveryState]string{store.DeliveryDelivered: webhookDelivered, store.DeliveryFailed: webhookFailed, store.DeliveryPending: webhookRetry}[state]
	w.m.webhooks.WithLabelValues(outcome).Inc()
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.q.RecordAttempt(rctx, d.ID, w.owner, a, state, next); err != nil {
		if errors.Is(err, store.ErrLeaseLost) {
			// Not a commit whose answer was lost: the store finds that
			// attempt recorded (store.AttemptRecorded).
			w.log.Warn("webhook attempt not recorded: the delivery's lease ran out during the attempt and another gateway claimed it, which attempts it in its turn; this attempt is known from this line only",
				"id", d.ID, "url", d.URL, "status", a.Status, "err", a.Error, "at", a.At)
			return
		}
		w.m.storeErrors.WithLabelValues("record_attempt").Inc()
		w.log.Error("webhook attempt not recorded; the delivery is tried again once its lease runs out", "id", d.ID, "err", err)
	}
	if state != store.DeliveryDelivered {
		w.log.Warn("webhook attempt failed", "id", d.ID, "url", d.URL, "status", a.Status, "err", a.Error, "state", state, "next_attempt_at", next)
	}
}

// cutByShutdown is the error of an attempt a stopping gateway cut short.
const cutByShutdown = "the gateway stopped during the attempt"

// madeAttempts counts the attempts of the retry schedule among as: those
// a stopping gateway cut short are not, so that each restart during an
// attempt does not use one up nor move the schedule on.
func madeAttempts(as []store.DeliveryAttempt) int {
	n := 0
	for _, a := range as {
		if a.Error != cutByShutdown {
			n++
		}
	}
	return n
}

func (w *webhooks) hook(url string) (Webhook, bool) {
	for _, h := range w.hooks {
		if h.URL == url {
			return h, true
		}
	}
	return Webhook{}, false
}

// post sends one attempt: its status, or 0 and why there is none; for a
// status that is not 2xx, the error says so.
func (w *webhooks) post(ctx context.Context, h Webhook, d store.Delivery, now time.Time) (int, string) {
	stopping := ctx
	ctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, strings.NewReader(string(d.Body)))
	if err != nil {
		return 0, err.Error()
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "timebox-webhooks")
	req.Header.Set(HeaderWebhookID, d.ID)
	req.Header.Set(HeaderWebhookTimestamp, ts)
	req.Header.Set(HeaderWebhookSignature, Sign(h.Secret, d.ID, ts, d.Body))
	resp, err := w.o.Client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && stopping.Err() == nil {
			return 0, fmt.Sprintf("no answer within %s", budget.FormatDuration(w.o.Timeout))
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, err.Error()
	}
	io.CopyN(io.Discard, resp.Body, maxWebhookAnswer)
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, "HTTP " + resp.Status
	}
	return resp.StatusCode, ""
}

// shutdown stores what is queued and stops sending: attempts in flight
// are cut and due again at once, for the next gateway to start (or
// another sharing the store). Offers must have ended (the turns have).
// It is idempotent.
func (w *webhooks) shutdown() {
	w.stopOnce.Do(func() {
		close(w.stopIn)
		w.stop()
		// A store that is away gets as long as it gets to store a turn's
		// end at Close (docs/decisions/store-outages.md).
		t := time.AfterFunc(storeGrace, w.stopStore)
		w.wg.Wait()
		t.Stop()
		w.stopStore()
		if w.transport != nil {
			w.transport.CloseIdleConnections()
		}
	})
}

// pruneEvery is how often a gateway deletes the deliveries older than
// WebhookOptions.Keep.
const pruneEvery = time.Hour

// storeGrace bounds how long a shutdown waits for a store that is away to
// take the deliveries still queued.
const storeGrace = 30 * time.Second

// The Standard Webhooks headers.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// Sign returns the webhook-signature of a message: "v1," and the base64
// of the HMAC-SHA256, keyed with secret, of id.timestamp.body (Standard
// Webhooks).
func Sign(secret []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// checkWebhookURL refuses a receiver that is not an http(s) URL with a
// host.
func checkWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q is not an http(s) URL", raw)
	case u.Hostname() == "":
		return fmt.Errorf("%q has no host", raw)
	}
	return nil
}

// CheckWebhooks returns an error, ready to show to a person, when a
// webhook's URL points at the server itself, listening on addr (host:port):
// each event it sends would be a request to the server, which is a loop
// at best. A URL points at the server when its port is addr's and its host
// is addr's, or is a loopback host while addr is loopback or every
// interface. Names other than localhost are not resolved.
func CheckWebhooks(hooks []Webhook, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %v", addr, err)
	}
	anyIf := host == "" || host == "0.0.0.0" || host == "::"
	for i, h := range hooks {
		u, err := url.Parse(h.URL)
		if err != nil {
			continue // New refuses it
		}
		up := u.Port()
		if up == "" {
			up = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if up != port {
			continue
		}
		uh := u.Hostname()
		if strings.EqualFold(uh, host) || (isLoopback(uh) && (isLoopback(host) || anyIf)) || (anyIf && (uh == "0.0.0.0" || uh == "::")) {
			return fmt.Errorf("server.webhooks[%d].url: %s points at this timebox server (listening on %s): a webhook goes to another service; give the receiver's URL", i, h.URL, addr)
		}
	}
	return nil
}

// DeliveryList is GET /v1/webhooks/deliveries: the newest deliveries
// first, each with its attempts.
type DeliveryList struct {
	// Deliveries are the deliveries that match, newest first.
	Deliveries []store.Delivery `json:"deliveries"`
}

var deliveryStates = []store.DeliveryState{store.DeliveryPending, store.DeliveryDelivered, store.DeliveryFailed}

// listDeliveries is GET /v1/webhooks/deliveries[?state=&turn_id=&limit=].
// A store that keeps no deliveries has none.
func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	f := store.DeliveryFilter{State: store.DeliveryState(qv.Get("state")), TurnID: qv.Get("turn_id")}
	if f.State != "" && !oneOf(string(f.State), deliveryStates) {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"state" must be one of %s`, joined(deliveryStates)))
		return
	}
	var err error
	if f.Limit, err = parseLimit(qv.Get("limit")); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	q, ok := s.cfg.Store.(store.Deliveries)
	if !ok {
		writeJSON(w, http.StatusOK, DeliveryList{Deliveries: []store.Delivery{}})
		return
	}
	ds, err := q.ListDeliveries(r.Context(), f)
	if err != nil {
		s.storeFailed(w, r, err, "webhook deliveries")
		return
	}
	writeJSON(w, http.StatusOK, DeliveryList{Deliveries: ds})
}
