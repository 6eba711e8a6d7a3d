package postgres

import (
	"net/url"
	"regexp"
	"strings"
)

// IsURL reports whether a --db value names a PostgreSQL database: a
// postgres:// or postgresql:// URL, or a libpq key=value connection
// string ("host=db.example dbname=timebox user=tb"). Anything else is a
// SQLite file's path.
func IsURL(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") || isKeyValue(db)
}

// libpqKey is a key of a libpq connection string: a value of --db with one
// of these before an "=" is a connection string, not a file name.
var libpqKey = regexp.MustCompile(`(?:^|\s)(host|hostaddr|port|dbname|user|password|passfile|sslmode|sslrootcert|sslcert|sslkey|connect_timeout|application_name|target_session_attrs|service|options|` +
	regexp.QuoteMeta(HeartbeatParam) + `)\s*=`)

func isKeyValue(db string) bool {
	return !strings.Contains(db, "://") && libpqKey.MatchString(db)
}

// passwordValue finds the password of a key=value connection string:
// quoted (with \' and \\ escapes) or up to the next space.
var passwordValue = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// Redact returns a database URL or connection string fit to print: its
// password, in the user part or as a password parameter, is replaced by
// "xxxxx". A URL that does not parse is not shown at all.
func Redact(dsn string) string {
	if isKeyValue(dsn) {
		return passwordValue.ReplaceAllString(dsn, "${1}xxxxx")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "(a database URL that does not parse; not shown, it may hold a password)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	q := u.Query()
	for k := range q {
		if strings.EqualFold(k, "password") {
			q.Set(k, "xxxxx")
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// heartbeatValue finds HeartbeatParam in a key=value connection string.
var heartbeatValue = regexp.MustCompile(`(?:^|\s)` + regexp.QuoteMeta(HeartbeatParam) + `\s*=\s*(\S*)`)
