package postgres_test

import (
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestFirstConnectionErrorsSayTheFix: the errors a newcomer meets when
// pointing timebox at a new database, against a real server: TLS asked of
// a server without it, a database or a role that does not exist. Each
// says what to do, and never the password.
func TestFirstConnectionErrorsSayTheFix(t *testing.T) {
	dsn := testenv.Postgres(t)
	base, _, _ := strings.Cut(dsn, "?")
	for _, c := range []struct{ name, dsn, want string }{
		{"tls refused", strings.Replace(dsn, "sslmode=disable", "sslmode=require", 1), "add sslmode=disable to the URL"},
		{"no database", base[:strings.LastIndex(base, "/")] + "/nosuchdb?sslmode=disable", "createdb -E UTF8 -O postgres nosuchdb"},
		{"no role", strings.Replace(dsn, "postgres@", "nosuchrole:sekrit@", 1), "createuser --pwprompt nosuchrole"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := postgres.Open(t.Context(), c.dsn, postgres.Options{})
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "sekrit") {
				t.Errorf("got %v\nwant it to say %q (and no password)", err, c.want)
			}
		})
	}
}
