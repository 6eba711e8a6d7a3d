package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// connectFix returns what to do about an error of a first connection that
// a newcomer setting up a database meets, or "" for any other error: a
// server without TLS asked for it, a role or a database that does not
// exist, a password refused. host, user and database are the connection's.
func connectFix(err error, host, user, database string) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "3D000": // invalid_catalog_name
			return fmt.Sprintf("create it with createdb -E UTF8 -O %s %s as the postgres user; see docs/postgres.md", user, database)
		case "28000": // invalid_authorization_specification: no such role, or no pg_hba.conf line
			if strings.Contains(pe.Message, "does not exist") {
				return fmt.Sprintf("create the role with createuser --pwprompt %s as the postgres user; see docs/postgres.md", user)
			}
			return "the server's pg_hba.conf has no line that lets this user in from here; see docs/postgres.md"
		case "28P01": // invalid_password
			return fmt.Sprintf("set it with ALTER ROLE %s PASSWORD '…' as the postgres user and put the same in the URL; see docs/postgres.md", user)
		}
	}
	if strings.Contains(err.Error(), "server refused TLS connection") {
		if local(host) {
			return "this server does not offer TLS: for a database on this machine add sslmode=disable to the URL, as in postgres://timebox:…@localhost/timebox?sslmode=disable"
		}
		return "this server does not offer TLS: turn on ssl in its postgresql.conf, or use sslmode=disable only on a network you trust"
	}
	return ""
}

// local reports whether host names this machine: a Unix socket's
// directory, localhost, or a loopback address.
func local(host string) bool {
	return strings.HasPrefix(host, "/") || host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.")
}
