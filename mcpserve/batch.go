package mcpserve

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// batchesRemoved is the first MCP protocol version without JSON-RPC
// batches. Versions are dates, compared as text, as the SDK compares them.
const batchesRemoved = "2025-06-18"

// batchRefusal returns the message a JSON-RPC batch is answered with
// (Invalid Request) under protocol, the session's negotiated version, or ""
// when protocol has batches: before 2025-06-18, or none negotiated yet
// (the SDK then takes 2025-03-26). The SDK's stdio transport ends the
// session at such a batch, and every call still running with it; its HTTP
// transport answers it with a text no JSON-RPC client reads. Both of
// timebox's transports answer it with this instead, and the session goes
// on.
func batchRefusal(protocol string) string {
	if protocol < batchesRemoved {
		return ""
	}
	return fmt.Sprintf("Invalid Request: JSON-RPC batches are not supported under MCP protocol %s, this session's (MCP removed them in %s): send the requests one by one", protocol, batchesRemoved)
}

// errorAnswer returns a JSON-RPC error response, without a line's end; a
// nil id is null.
func errorAnswer(id json.RawMessage, code int, msg string) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{code, msg}})
	return b
}

// refuseBatch answers a POST whose body is a JSON-RPC batch under a
// protocol without batches (its MCP-Protocol-Version header), as the stdio
// transport answers such a line: 400 Bad Request, as MCP asks of input a
// server does not accept, with a JSON-RPC error for a body. It reports
// whether it answered; when it did not, r's body is left whole. Only the
// body's first bytes up to one that is not white space are read.
func refuseBatch(w http.ResponseWriter, r *http.Request) bool {
	msg := batchRefusal(r.Header.Get("Mcp-Protocol-Version"))
	if r.Method != http.MethodPost || msg == "" || r.Body == nil {
		return false
	}
	br := bufio.NewReader(r.Body)
	r.Body = struct {
		io.Reader
		io.Closer
	}{br, r.Body}
	for i := 1; ; i++ {
		b, _ := br.Peek(i)
		if len(b) < i {
			return false // no body, or white space past the buffer: the SDK's
		}
		switch b[i-1] {
		case ' ', '\t', '\r', '\n':
			continue
		case '[':
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(errorAnswer(nil, -32600, msg))
			return true
		}
		return false
	}
}
