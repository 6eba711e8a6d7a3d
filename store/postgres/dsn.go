package postgres

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsURL reports whether a --db value names a database rather than a
// SQLite file: a postgres:// or postgresql:// URL (the scheme in any
// case), a libpq key=value connection string ("host=db.example
// dbname=timebox user=tb"), or a URL of any other scheme ("mysql://…"),
// which Open refuses: such a value is never a file's name, and taking it
// for one would make a file named after its password. "sqlite:" and
// "file:" values, and anything else, are a SQLite file's path.
func IsURL(db string) bool {
	if scheme, ok := urlScheme(db); ok {
		return !strings.EqualFold(scheme, "sqlite") && !strings.EqualFold(scheme, "file")
	}
	return isKeyValue(db)
}

// schemePrefix is the scheme of a URL and its "://". A scheme of one
// letter is a Windows drive ("C://data/timebox.db"), not a URL's.
var schemePrefix = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+)://`)

// urlScheme returns the scheme of a URL as written, and whether db is one.
func urlScheme(db string) (string, bool) {
	m := schemePrefix.FindStringSubmatch(db)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// isPostgresURL reports whether db is a postgres:// or postgresql:// URL,
// the scheme in any case.
func isPostgresURL(db string) bool {
	scheme, ok := urlScheme(db)
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// libpqKey is a key of a libpq (or pgx) connection string: a value of --db
// with one of these before an "=" is a connection string, not a file name.
// Case is ignored: HOST=db is no file's name either, and pgx's error
// says what is wrong with it.
var libpqKey = regexp.MustCompile(`(?i)(?:^|\s)(host|hostaddr|port|dbname|user|password|passfile|service|servicefile|options|` +
	`application_name|fallback_application_name|client_encoding|connect_timeout|target_session_attrs|load_balance_hosts|` +
	`keepalives|keepalives_idle|keepalives_interval|keepalives_count|tcp_user_timeout|replication|require_auth|channel_binding|` +
	`sslmode|sslnegotiation|sslcert|sslkey|sslpassword|sslcertmode|sslrootcert|sslcrl|sslcrldir|sslsni|requirepeer|` +
	`min_protocol_version|max_protocol_version|ssl_min_protocol_version|ssl_max_protocol_version|gssencmode|krbsrvname|gsslib|` +
	`pool_max_conns|pool_min_conns|statement_cache_capacity|default_query_exec_mode|` +
	regexp.QuoteMeta(HeartbeatParam) + `)\s*=`)

// isKeyValue reports whether db is a key=value connection string. Its
// values may hold anything, "://" too.
func isKeyValue(db string) bool {
	return !schemePrefix.MatchString(db) && libpqKey.MatchString(db)
}

// mask stands for a password, or for what may hold one, in what Redact
// returns.
const mask = "xxxxx"

// secretKey reports whether the value of a connection string's key is a
// password: password or sslpassword (which decrypts the client's key).
func secretKey(k string) bool {
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword")
}

// Redact returns a database URL or connection string fit to print or log:
// its passwords — the user part's, and the values of password and
// sslpassword in a URL's query or a key=value string, quoted or not — are
// replaced by "xxxxx". It reads the string the way pgx does, so what pgx
// would take for a password is masked however it is written; where that
// is ambiguous (a URL with an "@" after its user part, a key=value string
// that stops parsing), all that may hold one is masked. A value that is
// neither a URL nor a connection string (a SQLite file's path) is
// returned as it is.
func Redact(dsn string) string {
	switch {
	case schemePrefix.MatchString(dsn):
		return redactURL(dsn)
	case isKeyValue(dsn):
		return redactKeyValue(dsn)
	}
	return dsn
}

// redactURL masks the passwords of a URL, following pgx's (and libpq's)
// reading: the user part ends at the first "@" before any "/"; host,
// port and path run to the first "?"; the query is "&"-separated pairs
// whose keys may be percent-encoded.
func redactURL(dsn string) string {
	var b strings.Builder
	i := strings.Index(dsn, "://") + len("://")
	b.WriteString(dsn[:i])
	rest := dsn[i:]
	if at := strings.IndexAny(rest, "@/"); at >= 0 && rest[at] == '@' {
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + mask)
		}
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	// An "@" after the user part is that of a password with a "/" in it,
	// which pgx does not read as one: in the host or path
	// ("postgres://u:12/34@db/x"), or in the query of a URL whose port is
	// not a number ("postgres://u:a/b?c@db/x").
	where, query, hasQuery := strings.Cut(rest, "?")
	if at := strings.LastIndexByte(where, '@'); at >= 0 {
		where = mask + where[at:]
	} else if strings.Contains(query, "@") && !numericPorts(where) {
		return b.String() + mask
	}
	b.WriteString(where)
	if !hasQuery {
		return b.String()
	}
	b.WriteByte('?')
	for i, pair := range strings.Split(query, "&") {
		if i > 0 {
			b.WriteByte('&')
		}
		rawKey, _, hasValue := strings.Cut(pair, "=")
		key, err := url.PathUnescape(rawKey)
		switch {
		case !hasValue:
			// pgx refuses it; it may be the end of a password with an
			// "&" in it.
			b.WriteString(mask)
		case err != nil || secretKey(key):
			b.WriteString(rawKey + "=" + mask)
		default:
			b.WriteString(pair)
		}
	}
	return b.String()
}

// numericPorts reports whether every port of the hosts part of a URL
// (what follows its user part, up to its "?") is a number or empty.
func numericPorts(where string) bool {
	hosts, _, _ := strings.Cut(where, "/")
	for h := range strings.SplitSeq(hosts, ",") {
		if strings.HasPrefix(h, "[") {
			_, h, _ = strings.Cut(h, "]")
		}
		_, port, _ := strings.Cut(h, ":")
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	return true
}

// kvSpace is what separates the pairs of a key=value string, and may
// surround their "=".
const kvSpace = " \t\n\r\v\f"

// redactKeyValue masks the password values of a key=value string, read
// as pgx reads it (keyValuePairs). From where the string stops parsing (a
// word without "=", a quote not closed), all of it is masked.
func redactKeyValue(s string) string {
	pairs, stop := keyValuePairs(s)
	var b strings.Builder
	last := 0
	for _, p := range pairs {
		if secretKey(p.key) {
			b.WriteString(s[last:p.valueStart] + mask)
			last = p.end
		}
	}
	if stop >= 0 {
		return b.String() + s[last:stop] + mask
	}
	return b.String() + s[last:]
}

// kvPair is a pair of a key=value connection string: its key, its value
// as pgx reads it (unquoted, its escapes undone), and where it lies in the
// string: its key starts at start, its value (quotes included) runs from
// valueStart to end.
type kvPair struct {
	key, value             string
	start, valueStart, end int
}

// keyValuePairs reads a key=value string as pgx does (pgconn's
// parseKeywordValueSettings): a value is quoted, with \' and \\ escapes,
// or runs to the next space that no \ escapes. It returns the pairs read
// and, when the string stops parsing (a word without "=", a quote not
// closed), the index where the pair that does not parse starts; else -1.
// Whatever reads a connection string's keys reads them here, so that a
// password holding "key=value" is never taken for a pair.
func keyValuePairs(s string) (pairs []kvPair, stop int) {
	i := 0
	for {
		i = skipSpace(s, i)
		if i == len(s) {
			return pairs, -1
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return pairs, i
		}
		key := strings.Trim(s[i:i+eq], kvSpace)
		if key == "" || strings.ContainsAny(key, kvSpace) {
			return pairs, i
		}
		v := skipSpace(s, i+eq+1)
		n, ok := valueLen(s[v:])
		if !ok {
			return pairs, v
		}
		pairs = append(pairs, kvPair{key: key, value: unquote(s[v : v+n]), start: i, valueStart: v, end: v + n})
		i = v + n
	}
}

// skipSpace returns the index of the first byte of s from i on that is
// not kvSpace, or len(s).
func skipSpace(s string, i int) int {
	for i < len(s) && strings.IndexByte(kvSpace, s[i]) >= 0 {
		i++
	}
	return i
}

// valueLen returns the length of the value at the start of v, quotes
// included, and false for a quote that is not closed.
func valueLen(v string) (int, bool) {
	if v == "" || v[0] != '\'' {
		n := 0
		for n < len(v) && !strings.ContainsRune(kvSpace, rune(v[n])) {
			if v[n] == '\\' {
				n++
			}
			n++
		}
		return min(n, len(v)), true
	}
	for n := 1; n < len(v); n++ {
		switch v[n] {
		case '\\':
			n++
		case '\'':
			return n + 1, true
		}
	}
	return 0, false
}

// unquote returns a value of a key=value string as pgx reads it: without
// its quotes, a \ taking the byte after it as it is.
func unquote(v string) string {
	if strings.HasPrefix(v, "'") {
		v = v[1 : len(v)-1]
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' {
			i++
			if i == len(v) {
				break
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// parseError returns err, pgx's for a connection string it cannot parse,
// fit to show. pgx's *pgconn.ParseConfigError holds the whole string and
// shows it with only the passwords it finds masked (not the one in
// "password = x", nor all of a quoted one with \' in it), and its syntax
// errors quote words of the string, which may be part of a password. The
// error returned is a ParseConfigError of where (the string as Redact
// shows it) that says what pgx could not read, without those quotes.
func parseError(where string, err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return fmt.Errorf("postgres: %s: %w", where, err)
	}
	inner := errors.Unwrap(pe)
	bare := *pe
	bare.ConnString = ""
	msg, ok := strings.CutPrefix(bare.Error(), "cannot parse ``: ")
	if ok && inner != nil {
		msg, ok = strings.CutSuffix(msg, " ("+inner.Error()+")")
	}
	if !ok || strings.HasPrefix(msg, "failed to parse as ") {
		// A syntax error, or a message of a pgx that writes them
		// otherwise: say no more than that it does not parse.
		if !ok {
			msg = "it does not parse"
		}
		inner = nil
	}
	return fmt.Errorf("postgres: %w", pgconn.NewParseConfigError(where, msg, inner))
}
