// Package telemetry exports timebox's traces with OpenTelemetry's SDK over
// OTLP/HTTP, configured the standard way: by the OTEL_* environment
// variables. `timebox run`, `serve` and `worker` call FromEnv; a program
// that uses timebox as a library may too, or pass a TracerProvider of its
// own (timebox.Options.TracerProvider). What the spans say:
// docs/observability.md.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The variables FromEnv reads itself; the SDK reads the others
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT,
// OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, …).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Tracing is what FromEnv set up: a TracerProvider, or nil when the
// environment asks for no traces.
type Tracing struct {
	// Provider is nil when nothing is exported.
	Provider trace.TracerProvider
	// Endpoint says where spans go, for a start-up line; "" when nowhere.
	Endpoint string
	sdk      *sdktrace.TracerProvider
}

// Shutdown exports the spans still buffered and stops the exporter. Call
// it before the program exits. It is safe on a nil or empty Tracing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// Check validates the OTEL_* variables FromEnv reads, with getenv (nil is
// os.Getenv), and returns an error naming the variable and the fix; nil
// when they are unset or usable.
func Check(getenv func(string) string) error {
	_, err := settings(getenv)
	return err
}

type config struct {
	on       bool
	endpoint string // for messages
}

func settings(getenv func(string) string) (config, error) {
	if v := strings.ToLower(strings.TrimSpace(getenv(EnvSDKDisabled))); v == "true" {
		return config{}, nil
	}
	switch v := strings.TrimSpace(getenv(EnvTracesExporter)); v {
	case "", "otlp":
	case "none":
		return config{}, nil
	default:
		return config{}, fmt.Errorf("%s=%q: timebox exports traces over OTLP only (use otlp, or none)", EnvTracesExporter, v)
	}
	if _, err := resourceAttrs(getenv); err != nil {
		return config{}, err
	}
	for _, name := range []string{EnvTracesProtocol, EnvProtocol} {
		if v := strings.TrimSpace(getenv(name)); v != "" && v != "http/protobuf" {
			return config{}, fmt.Errorf("%s=%q: timebox exports traces over OTLP/HTTP with protobuf (use http/protobuf, or unset it)", name, v)
		}
	}
	c := config{}
	for _, name := range []string{EnvTracesEndpoint, EnvEndpoint} {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			shown := "a value that does not parse" // it may hold a password anywhere
			if err == nil {
				shown = strconv.Quote(u.Redacted())
			}
			return config{}, fmt.Errorf("%s=%s is not an http:// or https:// URL (for a collector on this machine: http://localhost:4318)", name, shown)
		}
		if c.endpoint == "" {
			c.on, c.endpoint = true, v
			if name == EnvEndpoint {
				c.endpoint = strings.TrimSuffix(v, "/") + "/v1/traces"
			}
		}
	}
	if !c.on && getenv(EnvTracesExporter) == "otlp" {
		// The OTLP default: a collector on this machine.
		c.on, c.endpoint = true, "http://localhost:4318/v1/traces"
	}
	return c, nil
}

// FromEnv sets up tracing as the OTEL_* variables say, read with getenv
// (nil is os.Getenv; the SDK itself reads the process's environment for
// the variables it knows). With no OTLP endpoint (neither
// OTEL_EXPORTER_OTLP_ENDPOINT nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, nor
// OTEL_TRACES_EXPORTER=otlp), with OTEL_TRACES_EXPORTER=none or
// OTEL_SDK_DISABLED=true, it returns an empty Tracing: nothing is
// exported and nothing is slower. service.name is "timebox" unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise.
func FromEnv(ctx context.Context, getenv func(string) string) (*Tracing, error) {
	if getenv == nil {
		getenv = osGetenv
	}
	c, err := settings(getenv)
	if err != nil || !c.on {
		return &Tracing{}, err
	}
	attrs, err := resourceAttrs(getenv)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(c.endpoint))
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	res := resource.NewSchemaless(attrs...)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithIDGenerator(IDs{}))
	return &Tracing{Provider: tp, Endpoint: c.endpoint, sdk: tp}, nil
}

// resourceAttrs are the resource's attributes: service.name "timebox",
// then OTEL_RESOURCE_ATTRIBUTES (key=value pairs separated by commas, the
// values percent-encoded), then OTEL_SERVICE_NAME, each over the last.
func resourceAttrs(getenv func(string) string) ([]attribute.KeyValue, error) {
	m := map[string]string{"service.name": "timebox"}
	order := []string{"service.name"}
	if v := strings.TrimSpace(getenv("OTEL_RESOURCE_ATTRIBUTES")); v != "" {
		for _, pair := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(pair, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES=%q: %q is not key=value (write service.namespace=agents,deployment.environment=prod)", v, pair)
			}
			dec, err := url.PathUnescape(strings.TrimSpace(val))
			if err != nil {
				return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES=%q: the value of %s is not percent-encoded correctly", v, k)
			}
			if _, seen := m[k]; !seen {
				order = append(order, k)
			}
			m[k] = dec
		}
	}
	if v := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); v != "" {
		m["service.name"] = v
	}
	out := make([]attribute.KeyValue, 0, len(order))
	for _, k := range order {
		out = append(out, attribute.String(k, m[k]))
	}
	return out, nil
}
