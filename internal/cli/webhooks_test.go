package cli_test

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/cli"
)

var cliWhsec = "whsec_" + base64.StdEncoding.EncodeToString([]byte("cli-webhook-test-key-of-32-bytes"))

// webhookAgent writes an agent file whose server sends turn_finished to url.
func webhookAgent(t *testing.T, url string) string {
	t.Helper()
	path := agentFile(t, `{"text": "hi"}`)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("server:\n  webhooks:\n    - {url: " + url + ", events: [turn_finished], secret_env: HOOK_SECRET}\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServeSendsWebhooks: `timebox serve` with server.webhooks POSTs a
// turn's turn_finished to the receiver, signed.
func TestServeSendsWebhooks(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
	}))
	defer rc.Close()
	path := webhookAgent(t, rc.URL+"/hook")
	db := filepath.Join(t.TempDir(), "timebox.db")
	url, _, stop := serveInProcess(t, []string{"HOOK_SECRET=" + cliWhsec}, "-f", path, "--db", db)
	defer stop()
	postTurn(t, url, `{"input": "hi"}`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the receiver got nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if h := got[0]; !strings.HasPrefix(h.Get("webhook-signature"), "v1,") || !strings.HasPrefix(h.Get("webhook-id"), "msg_") {
		t.Errorf("headers %v", h)
	}
}

// TestServeRefusesWebhooksWithoutTheirSecret: an unset secret, one that is
// not whsec_, and a receiver that is the server itself stop serve before it
// starts; validate shows the webhooks and warns of the unset secret.
func TestServeRefusesWebhooksWithoutTheirSecret(t *testing.T) {
	path := webhookAgent(t, "https://hooks.example.com/x")
	db := filepath.Join(t.TempDir(), "timebox.db")
	r := run(t, nil, "serve", "-f", path, "--db", db, "--addr", "127.0.0.1:0")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, path+":9:79: server.webhooks[0].secret_env: HOOK_SECRET is not set") {
		t.Fatalf("serve without the secret: exit %d, %s", r.code, r.err)
	}
	r = run(t, []string{"HOOK_SECRET=s3cret-value"}, "serve", "-f", path, "--db", db, "--addr", "127.0.0.1:0")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "HOOK_SECRET is not a whsec_ secret") || strings.Contains(r.err, "s3cret-value") {
		t.Fatalf("serve with a bad secret: exit %d, %s", r.code, r.err)
	}
	self := webhookAgent(t, "http://127.0.0.1:18931/v1/turns")
	r = run(t, []string{"HOOK_SECRET=" + cliWhsec}, "serve", "-f", self, "--db", db, "--addr", "127.0.0.1:18931")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "points at this timebox server") {
		t.Fatalf("serve with a webhook to itself: exit %d, %s", r.code, r.err)
	}

	r = run(t, nil, "validate", "-f", path, "--db", db)
	if r.code != cli.ExitOK || !strings.Contains(r.err, "warning: "+path+":9:79: server.webhooks[0].secret_env: HOOK_SECRET is not set") ||
		!strings.Contains(r.out, "https://hooks.example.com/x") || !strings.Contains(r.out, "HOOK_SECRET (NOT SET)") {
		t.Fatalf("validate: exit %d\n%s\n%s", r.code, r.out, r.err)
	}
	r = run(t, []string{"HOOK_SECRET=" + cliWhsec}, "validate", "-f", path, "--db", db)
	if r.code != cli.ExitOK || !strings.Contains(r.out, "HOOK_SECRET (set)") || strings.Contains(r.out+r.err, cliWhsec) {
		t.Fatalf("validate with the secret: exit %d\n%s\n%s", r.code, r.out, r.err)
	}
}
