package agent

import "regexp"

// MaxInputBytes is the largest input text a person's turn takes: the
// default limit of POST /v1/turns (server.Config.MaxInputBytes), and the
// limit of timebox run's prompt.
const MaxInputBytes = 256 << 10

// SessionIDForm says what ValidSessionID takes, for messages.
const SessionIDForm = "1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"

var sessionID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// ValidSessionID reports whether id can name a session (SessionIDForm):
// safe in a URL's path, a log line and a terminal. The server and
// timebox run take no other.
func ValidSessionID(id string) bool { return sessionID.MatchString(id) }
