package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/timebox-run/timebox/server"
)

// TestFollowersGetEveryEventOnce: while a turn streams events as fast as
// the model sends them — queued for the store and committed in batches —
// followers join at random moments from random points, and drop and
// resume; each gets every event after its starting point exactly once, in
// order, up to turn_finished. The sink publishes an event only once the
// store has it, so a replay from the store never misses what the live
// stream has already passed (docs/decisions/group-commit.md).
func TestFollowersGetEveryEventOnce(t *testing.T) {
	chunks := make([]string, 2000)
	for i := range chunks {
		chunks[i] = fmt.Sprint(i%10, " ")
	}
	line, _ := json.Marshal(map[string]any{"chunks": chunks, "chunk_delay": "50us"})
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, string(line)))})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)

	const followers = 12
	var wg sync.WaitGroup
	errs := make(chan error, followers)
	var mu sync.Mutex
	var seen int64 // the highest seq any follower has read
	for f := range followers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(f), 1))
			mu.Lock()
			start := rnd.Int64N(seen + 1) // somewhere in what was already sent
			mu.Unlock()
			last := start
			for hop := 0; ; hop++ {
				resp, err := e.doCtx(t.Context(), "GET", fmt.Sprintf("/v1/turns/%s/events?after=%d", acc.TurnID, last), nil)
				if err != nil {
					errs <- err
					return
				}
				if resp.StatusCode == http.StatusNoContent {
					resp.Body.Close()
					errs <- fmt.Errorf("follower %d: 204 after %d without turn_finished", f, last)
					return
				}
				sse := newSSE(resp.Body)
				// Read a random number of events, then drop and resume.
				for n := 50 + rnd.IntN(500); n > 0; n-- {
					ev, err := sse.next()
					if err == io.EOF {
						resp.Body.Close()
						errs <- fmt.Errorf("follower %d: the stream ended after %d without turn_finished", f, last)
						return
					}
					if err != nil {
						resp.Body.Close()
						errs <- err
						return
					}
					if ev.id != last+1 {
						resp.Body.Close()
						errs <- fmt.Errorf("follower %d (from %d, hop %d): event %d after %d", f, start, hop, ev.id, last)
						return
					}
					last = ev.id
					mu.Lock()
					seen = max(seen, last)
					mu.Unlock()
					if ev.typ == "turn_finished" {
						resp.Body.Close()
						return
					}
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Chunks that arrive while the sinks are busy go as one llm_delta
	// (docs/decisions/streams-and-the-turn-ceiling.md), so the record is
	// checked for every chunk's text, and for more events than a follower
	// reads before it drops and resumes.
	// The followers had turn_finished live; the store may still be
	// writing the last events.
	rec := e.waitEnded(acc.TurnID)
	n := len(rec.Events)
	var text strings.Builder
	for _, raw := range rec.Events {
		var d struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &d); err == nil && d.Type == "llm_delta" {
			text.WriteString(d.Text)
		}
	}
	if n <= 550 || !strings.Contains(string(rec.Events[n-1]), "turn_finished") || text.String() != strings.Join(chunks, "") {
		t.Fatalf("the turn has %d events, with %d of the %d bytes streamed", n, text.Len(), len(strings.Join(chunks, "")))
	}
}
