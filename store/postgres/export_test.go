package postgres

import "time"

// Crash makes s stop as a killed process would: no turn is marked, no
// owner removed, its heartbeats stop. s is unusable afterwards.
func (s *Store) Crash() { s.crash() }

// DropNotifications makes s ignore every notification, as if each were
// lost: what it learns, it learns by polling.
func (s *Store) DropNotifications(drop bool) { s.dropNotify.Store(drop) }

// Recover runs one look for gone owners now, as a heartbeat does.
func (s *Store) Recover() ([]string, error) { return s.recover(s.ctx) }

// SeenFor makes the store as if it had seen the database for d: a judge
// that may take others for gone at once.
func (s *Store) SeenFor(d time.Duration) {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	s.upSince = s.upSince.Add(-d)
}

// LoseCommitAnswers makes the next n commits of numbered groups answer
// with an error that passes although they were stored, as when the
// connection is cut as the database commits.
func (s *Store) LoseCommitAnswers(n int) { s.loseAnswers.Store(int32(n)) }

// LoseDurableAnswers makes the next n commits of durable writes (a
// turn's end, a webhook attempt's record) answer with an error that passes
// although they were stored.
func (s *Store) LoseDurableAnswers(n int) { s.loseDurable.Store(int32(n)) }

// BeforePiece sets the function called before each piece of a long text
// is written, whose error stands for the write's (nil: none).
func BeforePiece(f func() error) { beforePiece = f }

// TakeHeartbeat is takeHeartbeat: dsn without HeartbeatParam, and its value.
func TakeHeartbeat(dsn string) (string, time.Duration, error) { return takeHeartbeat(dsn) }

// HasParam is hasParam: whether dsn sets key.
func HasParam(dsn, key string) bool { return hasParam(dsn, key) }

// Beat renews the store's heartbeat now, as its heartbeat does.
func (s *Store) Beat() error { return s.beat(s.ctx) }

// HungAfter sets how long the database may answer nothing before a wait
// on it is given up (BeginTurn, reads), and returns a function that puts
// it back.
func HungAfter(d time.Duration) (undo func()) {
	was := hungAfter
	hungAfter = d
	return func() { hungAfter = was }
}

// BeforeBeginCommit sets the function BeginTurn calls just before its
// COMMIT is sent (nil: none).
func BeforeBeginCommit(f func(backend int)) { beforeBeginCommit = f }

// Unbegun returns the turns whose BeginTurn failed with its COMMIT
// unanswered, not yet ended or found not stored.
func (s *Store) Unbegun() int {
	s.unbegunMu.Lock()
	defer s.unbegunMu.Unlock()
	return len(s.unbegunIDs)
}
