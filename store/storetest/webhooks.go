package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/store"
)

func deliveriesOf(t *testing.T, s store.Store) store.Deliveries {
	t.Helper()
	d, ok := s.(store.Deliveries)
	if !ok {
		t.Skip("this store keeps no webhook deliveries")
	}
	return d
}

func delivery(id string, due time.Time) store.Delivery {
	return store.Delivery{ID: id, URL: "http://127.0.0.1:9/hook", EventType: "turn_finished", TurnID: "t-" + id, Seq: 7,
		Body: []byte(`{"type":"turn_finished","nul":"\u0000"}` + "\x00\xff"), CreatedAt: due, NextAttemptAt: due}
}

// testDeliveries: a delivery is stored pending, claimed once due by one
// owner while its lease lasts, and its attempts kept.
func testDeliveries(t *testing.T, s store.Store) {
	q := deliveriesOf(t, s)
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := delivery("msg_a", now), delivery("msg_b", now.Add(time.Minute))
	if err := q.EnqueueDeliveries(ctx, []store.Delivery{a, b}); err != nil {
		t.Fatal(err)
	}
	// Again: a no-op, even with another body.
	a2 := a
	a2.Body = []byte("other")
	if err := q.EnqueueDeliveries(ctx, []store.Delivery{a2}); err != nil {
		t.Fatal(err)
	}
	got, err := q.ClaimDeliveries(ctx, "g1", now, time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "msg_a" || string(got[0].Body) != string(a.Body) || got[0].State != store.DeliveryPending ||
		got[0].URL != a.URL || got[0].TurnID != a.TurnID || got[0].Seq != 7 || got[0].EventType != "turn_finished" || !got[0].CreatedAt.Equal(now) {
		t.Fatalf("claimed %+v, want msg_a as enqueued (msg_b is not due)", got)
	}
	if again, err := q.ClaimDeliveries(ctx, "g2", now.Add(30*time.Second), time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("claimed %+v (%v) while g1's lease lasts", again, err)
	}
	// g1's lease ran out: g2 takes msg_a (and msg_b, now due), and g1's
	// late record is refused.
	got, err = q.ClaimDeliveries(ctx, "g2", now.Add(2*time.Minute), time.Minute, 10)
	if err != nil || len(got) != 2 || got[0].ID != "msg_a" || got[1].ID != "msg_b" {
		t.Fatalf("claimed %+v (%v), want msg_a then msg_b", got, err)
	}
	at := now.Add(2 * time.Minute)
	att := store.DeliveryAttempt{At: at, Status: 500, DurationMS: 12, Error: "HTTP 500", By: "g1", NextRetryAt: at.Add(time.Second)}
	if err := q.RecordAttempt(ctx, "msg_a", "g1", att, store.DeliveryPending, at.Add(time.Second)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a lost lease's record: %v, want ErrLeaseLost", err)
	}
	if err := q.RecordAttempt(ctx, "msg_x", "g2", att, store.DeliveryPending, at); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown delivery's record: %v, want ErrNotFound", err)
	}
	att.By = "g2"
	if err := q.RecordAttempt(ctx, "msg_a", "g2", att, store.DeliveryPending, at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.RecordAttempt(ctx, "msg_b", "g2", store.DeliveryAttempt{At: at, Status: 204, DurationMS: 3, By: "g2"}, store.DeliveryDelivered, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// msg_a is due again a second later, and its lease ended with the
	// attempt: g1 may take it then, not before.
	if got, err := q.ClaimDeliveries(ctx, "g1", at, time.Minute, 10); err != nil || len(got) != 0 {
		t.Fatalf("claimed %+v (%v) before it is due", got, err)
	}
	got, err = q.ClaimDeliveries(ctx, "g1", at.Add(time.Second), time.Minute, 10)
	if err != nil || len(got) != 1 || got[0].ID != "msg_a" || len(got[0].Attempts) != 1 || got[0].Attempts[0].Status != 500 {
		t.Fatalf("claimed %+v (%v), want msg_a with its attempt", got, err)
	}
	if err := q.RecordAttempt(ctx, "msg_a", "g1", store.DeliveryAttempt{At: at.Add(time.Second), Error: "connection refused", By: "g1"}, store.DeliveryFailed, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got, err := q.ClaimDeliveries(ctx, "g1", at.Add(time.Hour), time.Minute, 10); err != nil || len(got) != 0 {
		t.Fatalf("claimed %+v (%v): nothing is pending", got, err)
	}

	list, err := q.ListDeliveries(ctx, store.DeliveryFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "msg_b" || list[1].ID != "msg_a" {
		t.Fatalf("listed %+v, want msg_b then msg_a (newest first)", list)
	}
	if l := list[1]; l.State != store.DeliveryFailed || len(l.Attempts) != 2 || l.Body != nil || !l.NextAttemptAt.IsZero() ||
		l.Attempts[0].Status != 500 || l.Attempts[0].DurationMS != 12 || l.Attempts[0].Error != "HTTP 500" || l.Attempts[0].By != "g2" ||
		!l.Attempts[0].NextRetryAt.Equal(at.Add(time.Second)) || !l.Attempts[0].At.Equal(at) || l.Attempts[1].Error != "connection refused" {
		t.Errorf("msg_a listed as %+v", l)
	}
	if l := list[0]; l.State != store.DeliveryDelivered || len(l.Attempts) != 1 || l.Attempts[0].Status != 204 {
		t.Errorf("msg_b listed as %+v", l)
	}
	// Pruning keeps what is pending and what is newer than its bound.
	c := delivery("msg_c", now.Add(-time.Hour))
	if err := q.EnqueueDeliveries(ctx, []store.Delivery{c}); err != nil {
		t.Fatal(err)
	}
	if n, err := q.PruneDeliveries(ctx, now.Add(30*time.Second)); err != nil || n != 1 {
		t.Fatalf("PruneDeliveries before msg_b = %d (%v), want 1 (msg_a; msg_c is pending, msg_b newer)", n, err)
	}
	if l, err := q.ListDeliveries(ctx, store.DeliveryFilter{}); err != nil || len(l) != 2 || l[0].ID != "msg_c" || l[1].ID != "msg_b" {
		t.Fatalf("after pruning: %+v (%v), want msg_c and msg_b", l, err)
	}
	if n, err := q.PruneDeliveries(ctx, now.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneDeliveries of the rest = %d (%v), want 1 (msg_b)", n, err)
	}
}

// testDeliveryFilters: ListDeliveries' filters and limit.
func testDeliveryFilters(t *testing.T, s store.Store) {
	q := deliveriesOf(t, s)
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := delivery("msg_a", now), delivery("msg_b", now)
	if err := q.EnqueueDeliveries(ctx, []store.Delivery{a, b}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ClaimDeliveries(ctx, "g", now, time.Minute, 10); err != nil {
		t.Fatal(err)
	}
	if err := q.RecordAttempt(ctx, "msg_a", "g", store.DeliveryAttempt{At: now}, store.DeliveryFailed, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := q.RecordAttempt(ctx, "msg_b", "g", store.DeliveryAttempt{At: now, Status: 200}, store.DeliveryDelivered, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		f    store.DeliveryFilter
		want int
	}{{store.DeliveryFilter{State: store.DeliveryFailed}, 1}, {store.DeliveryFilter{TurnID: "t-msg_b"}, 1},
		{store.DeliveryFilter{State: store.DeliveryPending}, 0}, {store.DeliveryFilter{Limit: 1}, 1}} {
		if l, err := q.ListDeliveries(ctx, f.f); err != nil || len(l) != f.want {
			t.Errorf("ListDeliveries(%+v) = %d deliveries (%v), want %d", f.f, len(l), err, f.want)
		}
	}
}

// testDeliveryClaimsAreExclusive: owners claiming at once each get their
// own deliveries; every delivery is claimed exactly once.
func testDeliveryClaimsAreExclusive(t *testing.T, s store.Store) {
	q := deliveriesOf(t, s)
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const n = 200
	var ds []store.Delivery
	for i := range n {
		ds = append(ds, delivery(fmt.Sprintf("msg_%03d", i), now))
	}
	if err := q.EnqueueDeliveries(ctx, ds); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			owner := fmt.Sprintf("g%d", g)
			for {
				got, err := q.ClaimDeliveries(ctx, owner, now, time.Hour, 7)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					if prev, ok := seen[d.ID]; ok {
						t.Errorf("%s claimed by %s and %s", d.ID, prev, owner)
					}
					seen[d.ID] = owner
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("%d deliveries claimed, want %d", len(seen), n)
	}
}
