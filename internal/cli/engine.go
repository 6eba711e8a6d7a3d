package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/timebox-run/timebox/temporal"
)

// Engines a turn runs on.
const (
	engineEmbedded = "embedded"
	engineTemporal = temporal.Engine
)

// Defaults of the Temporal flags.
const (
	defaultTemporalAddress   = "127.0.0.1:7233"
	defaultTemporalNamespace = "default"
)

// engineFlags are the flags of the commands that run turns on an engine:
// run and serve take --engine; worker runs Temporal's side always.
type engineFlags struct {
	engine, address, namespace, queue, heartbeat *string
}

// addEngineFlags adds the Temporal flags to fs; withEngine adds --engine,
// withHeartbeat --worker-heartbeat.
func addEngineFlags(fs *flag.FlagSet, withEngine, withHeartbeat bool) *engineFlags {
	e := &engineFlags{}
	if withEngine {
		e.engine = fs.String("engine", "", "where turns run: embedded (in this process) or temporal (on Temporal workers: timebox worker) (env TIMEBOX_ENGINE; default embedded)")
	}
	e.address = fs.String("temporal-address", "", "the Temporal frontend, HOST:PORT (env TIMEBOX_TEMPORAL_ADDRESS; default "+defaultTemporalAddress+")")
	e.namespace = fs.String("temporal-namespace", "", "the Temporal namespace (env TIMEBOX_TEMPORAL_NAMESPACE; default "+defaultTemporalNamespace+")")
	e.queue = fs.String("task-queue", "", "the Temporal task queue of the turns (env TIMEBOX_TEMPORAL_TASK_QUEUE; default "+temporal.DefaultTaskQueue+")")
	if withHeartbeat {
		e.heartbeat = fs.String("worker-heartbeat", "", "how often a unit of work heartbeats; a worker silent this long is taken for dead (env TIMEBOX_TEMPORAL_WORKER_HEARTBEAT; default "+
			temporal.DefaultHeartbeat.String()+", 500ms to 1m)")
	}
	return e
}

// engineSettings are the resolved engine flags.
type engineSettings struct {
	Engine    string
	Address   string
	Namespace string
	TaskQueue string
	Heartbeat time.Duration
}

// resolve returns the flags' values (flag > env > default), checked.
func (e *engineFlags) resolve(fs *flag.FlagSet, o IO) (engineSettings, error) {
	s := engineSettings{Engine: engineTemporal}
	if e.engine != nil {
		var from string
		s.Engine, from = settingFrom(fs, "engine", *e.engine, "TIMEBOX_ENGINE", o, engineEmbedded)
		if s.Engine != engineEmbedded && s.Engine != engineTemporal {
			return s, fmt.Errorf("%s %q: use embedded or temporal", from, s.Engine)
		}
	}
	var from string
	s.Address, from = settingFrom(fs, "temporal-address", *e.address, "TIMEBOX_TEMPORAL_ADDRESS", o, defaultTemporalAddress)
	if _, _, err := net.SplitHostPort(s.Address); err != nil {
		return s, fmt.Errorf("%s %q: give HOST:PORT, e.g. %s", from, s.Address, defaultTemporalAddress)
	}
	s.Namespace = setting(fs, "temporal-namespace", *e.namespace, "TIMEBOX_TEMPORAL_NAMESPACE", o, defaultTemporalNamespace)
	s.TaskQueue = setting(fs, "task-queue", *e.queue, "TIMEBOX_TEMPORAL_TASK_QUEUE", o, temporal.DefaultTaskQueue)
	if e.heartbeat != nil {
		v, from := settingFrom(fs, "worker-heartbeat", *e.heartbeat, "TIMEBOX_TEMPORAL_WORKER_HEARTBEAT", o, temporal.DefaultHeartbeat.String())
		d, err := time.ParseDuration(v)
		if err != nil {
			return s, fmt.Errorf("%s %q: give a duration such as 3s", from, v)
		}
		if err := temporal.CheckHeartbeat(d); err != nil {
			return s, fmt.Errorf("%s: %w", from, err)
		}
		s.Heartbeat = d
	}
	return s, nil
}

// describe writes the settings for validate.
func (s engineSettings) describe(w io.Writer) {
	if s.Engine != engineTemporal {
		fmt.Fprintf(w, "\nengine: %s (turns run in this process)\n", s.Engine)
		return
	}
	fmt.Fprintf(w, "\nengine: temporal at %s, namespace %s, task queue %s", s.Address, s.Namespace, s.TaskQueue)
	if s.Heartbeat > 0 {
		fmt.Fprintf(w, ", worker heartbeat %s", s.Heartbeat)
	}
	fmt.Fprintln(w)
}

// dial connects to Temporal within 10s. The SDK's own log lines go to
// stderr at warning level and above, but for the "Workflow panic" of a
// worker that hands its turns over as it stops (temporal.QuietHandOvers).
func (s engineSettings) dial(ctx context.Context, o IO) (client.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	logger := sdklog.NewStructuredLogger(slog.New(temporal.QuietHandOvers(slog.NewTextHandler(o.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	c, err := client.DialContext(ctx, client.Options{HostPort: s.Address, Namespace: s.Namespace, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("connecting to Temporal at %s (namespace %s): %w; is the server running (temporal server start-dev)?", s.Address, s.Namespace, err)
	}
	return c, nil
}
