package config

import "github.com/timebox-run/timebox/internal/problem"

// suggest and didYouMean are the rule every file timebox reads uses to
// suggest the key meant (internal/problem).
func suggest(s string, candidates []string) string { return problem.Suggest(s, candidates) }

func didYouMean(s string, candidates []string) string { return problem.DidYouMean(s, candidates) }
