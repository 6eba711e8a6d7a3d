package agent

import (
	"sync"
	"time"
)

// ceiling is the timer of a turn's ceiling in this process. It stops
// while the turn waits for nothing but people (machine.Pauses), and runs
// again to where the wait moved it.
type ceiling struct {
	mu     sync.Mutex
	timer  *time.Timer
	at     time.Time
	waited time.Duration // the time the ceiling was moved by, so far
	fired  bool
	fire   func(waited time.Duration)
}

// newCeiling returns a ceiling that calls fire at at, with the time waits
// for people have moved it since.
func newCeiling(at time.Time, fire func(waited time.Duration)) *ceiling {
	c := &ceiling{at: at, fire: fire}
	c.timer = time.AfterFunc(time.Until(at), c.expired)
	return c
}

func (c *ceiling) expired() {
	c.mu.Lock()
	waited := c.waited
	c.fired = true
	c.mu.Unlock()
	c.fire(waited)
}

// pause stops the ceiling (paused) or sets it to fall at at.
func (c *ceiling) pause(paused bool, at time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fired {
		return
	}
	if paused {
		c.timer.Stop()
		return
	}
	c.waited += at.Sub(c.at)
	c.at = at
	c.timer.Reset(time.Until(at))
}

func (c *ceiling) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer.Stop()
}
