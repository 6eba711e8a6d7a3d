package server

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 description of the API, served at
// GET /v1/openapi.json. openapi_test.go keeps it true: every route of the
// mux is in it, every status it documents is produced and answers with
// the body it documents, and its schemas have the fields of the Go types
// they describe. docs/http-api.md is its guide.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 document of the API (JSON), as
// GET /v1/openapi.json serves it. The caller must not modify it.
func OpenAPI() []byte { return openAPI }

// getOpenAPI serves the document. It sits behind the token like every
// /v1 route (docs/decisions/openapi.md).
func (s *Server) getOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPI)
}
