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

// FillDisk makes every write that grows the file fail as on a full disk
// (SQLITE_FULL): the file may not grow past pages more pages.
func (s *Store) FillDisk(more int) error {
	var n int
	if err := s.w.QueryRow(`PRAGMA page_count`).Scan(&n); err != nil {
		return err
	}
	_, err := s.w.Exec(`PRAGMA max_page_count = ` + itoa(n+more))
	return err
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
