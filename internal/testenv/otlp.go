package testenv

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLP is an OTLP/HTTP trace receiver on loopback: it decodes what an
// exporter posts to /v1/traces (protobuf, gzip or not) as a collector
// would. Its URL plus "/v1/traces" is an OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
// Its methods are safe for concurrent use.
type OTLP struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	resource map[string]string
	refused  []string
}

// NewOTLP starts a receiver, closed when the test ends.
func NewOTLP(t testing.TB) *OTLP {
	r := &OTLP{resource: map[string]string{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			r.refused = append(r.refused, fmt.Sprintf("%s %s %s", req.Method, req.URL.Path, req.Header.Get("Content-Type")))
			http.Error(w, "not OTLP/HTTP protobuf", http.StatusBadRequest)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, _ := io.ReadAll(body)
		var msg coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &msg); err != nil {
			r.refused = append(r.refused, "undecodable: "+err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range msg.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				r.resource[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// Spans returns the spans received so far, in the order they came.
func (r *OTLP) Spans() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

// ByName returns the spans received so far by name.
func (r *OTLP) ByName() map[string][]*tracepb.Span {
	m := map[string][]*tracepb.Span{}
	for _, s := range r.Spans() {
		m[s.GetName()] = append(m[s.GetName()], s)
	}
	return m
}

// Resource returns the string attributes of the resources received.
func (r *OTLP) Resource() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]string, len(r.resource))
	for k, v := range r.resource {
		m[k] = v
	}
	return m
}

// Refused returns what the receiver refused: requests that were not
// OTLP/HTTP protobuf, bodies it could not decode.
func (r *OTLP) Refused() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.refused...)
}

// SpanAttrs returns a span's attributes by key.
func SpanAttrs(s *tracepb.Span) map[string]*commonpb.AnyValue {
	m := map[string]*commonpb.AnyValue{}
	for _, kv := range s.GetAttributes() {
		m[kv.GetKey()] = kv.GetValue()
	}
	return m
}
