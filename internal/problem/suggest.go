package problem

import "strings"

// Suggest returns the candidate closest to s when it is close enough to be
// a likely typo, or "". Close enough is an edit distance of at most a
// third of the longer word (at least 1), so "tol" finds "tool" but "x"
// finds nothing.
//
// A word that is the start of exactly one candidate ("parallel" for
// "parallel_tools") also finds it, because a shortened key is as common as
// a misspelt one.
func Suggest(s string, candidates []string) string {
	if len(s) >= 4 {
		match := ""
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), strings.ToLower(s)) {
				if match != "" {
					match = ""
					break
				}
				match = c
			}
		}
		if match != "" {
			return match
		}
	}
	best, bestD := "", -1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		d := distance(ls, strings.ToLower(c))
		limit := max(len(s), len(c)) / 3
		if limit < 1 {
			limit = 1
		}
		if d <= limit && (bestD < 0 || d < bestD) {
			best, bestD = c, d
		}
	}
	return best
}

// DidYouMean is Suggest worded for the end of a message: " (did you mean
// tool?)" or "".
func DidYouMean(s string, candidates []string) string {
	if c := Suggest(s, candidates); c != "" {
		return " (did you mean " + c + "?)"
	}
	return ""
}

// distance is the Levenshtein distance between a and b, counting an
// adjacent transposition as one edit, because swapped letters are the
// commonest typo.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 256 || len(rb) > 256 {
		// Nothing that long is a typo of a key; spare the quadratic work.
		return 1 << 30
	}
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
