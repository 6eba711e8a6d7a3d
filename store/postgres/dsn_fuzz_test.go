package postgres

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzKeyValueAgreesWithPgx: timebox reads a key=value connection string
// (keyValuePairs, behind Redact and the timebox_heartbeat parameter) as
// pgx does. Whenever pgx takes a password from the string, keyValuePairs
// finds the same one, and Redact does not show it.
func FuzzKeyValueAgreesWithPgx(f *testing.F) {
	for _, s := range []string{
		"host=db password=hunter2 dbname=x",
		`host=db password='it\'s a secret' dbname=x`,
		`host=h password=s3c\ retC dbname=x`,
		"host=h password = s3cretA port=5432",
		"host=db password='a timebox_heartbeat=1s' sslmode=disable",
		"password=first host=db password=second",
		"host=db password='' user=u",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !isKeyValue(s) {
			return
		}
		cfg, err := pgconn.ParseConfig(s)
		if err != nil {
			return
		}
		pairs, stop := keyValuePairs(s)
		if stop >= 0 {
			t.Fatalf("pgx parses %q, keyValuePairs stops at %d", s, stop)
		}
		password, given := "", false
		for _, p := range pairs {
			if p.key == "password" {
				password, given = p.value, true
			}
		}
		if given && password != cfg.Password {
			t.Fatalf("%q: pgx reads password %q, keyValuePairs %q", s, cfg.Password, password)
		}
		if !given || password == "" {
			return
		}
		// What of s is not a password's value may hold the password too
		// ("host=x password=x"): Redact must show it no more often.
		rest, last := "", 0
		for _, p := range pairs {
			if secretKey(p.key) {
				rest += s[last:p.valueStart] + "\x00"
				last = p.end
			}
		}
		rest += s[last:]
		shown := strings.ReplaceAll(Redact(s), mask, "\x00")
		if strings.Count(shown, password) > strings.Count(rest, password) {
			t.Fatalf("Redact(%q) = %q shows the password %q", s, Redact(s), password)
		}
	})
}
