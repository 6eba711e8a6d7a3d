package sqlite

// Crash makes s stop as a killed process would: no turn is marked, no owner
// removed, the file is just let go. s is unusable afterwards.
func (s *Store) Crash() {
	s.closeOnce.Do(func() {
		s.stopWriters()
		liveOwners.Delete(s.owner)
		s.closeErr = s.closeDBs()
	})
}
