package advice

import (
	"fmt"
	"strings"
)

// Diff returns the change from a to b as a unified diff (the form of
// diff -u and git diff: ---/+++ headers naming from and to, @@ hunks with
// three lines of context); "" when they are the same. It compares lines
// by a longest common subsequence, which an agent file's few hundred
// lines afford; written here because the standard library has none and
// what --apply prints is this small.
func Diff(from, to string, a, b []byte) string {
	if string(a) == string(b) {
		return ""
	}
	x, y := splitLines(string(a)), splitLines(string(b))
	ops := lcsOps(x, y)
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", from, to)
	const context = 3
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		// A hunk: from context lines before the change to context lines
		// after the last change that is within 2*context of the next.
		start := max(i-context, 0)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind != ' ' {
				end = j
			} else if j-end > 2*context {
				break
			}
		}
		stop := min(end+context+1, len(ops))
		ax, bx := ops[start].ai, ops[start].bi
		var an, bn int
		var body strings.Builder
		for _, op := range ops[start:stop] {
			switch op.kind {
			case ' ':
				an, bn = an+1, bn+1
				body.WriteString(" " + x[op.ai])
			case '-':
				an++
				body.WriteString("-" + x[op.ai])
			case '+':
				bn++
				body.WriteString("+" + y[op.bi])
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n%s", hunkRange(ax, an), hunkRange(bx, bn), body.String())
		i = stop
	}
	return out.String()
}

func hunkRange(at, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", at)
	}
	if n == 1 {
		return fmt.Sprint(at + 1)
	}
	return fmt.Sprintf("%d,%d", at+1, n)
}

// splitLines splits s after each newline; a last line without one gets
// one, marked as diff marks it.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	} else {
		lines[len(lines)-1] += "\n\\ No newline at end of file\n"
	}
	return lines
}

// op is one line of the diff: kept (' '), removed ('-') or added ('+'),
// with its index in a (ai) and b (bi) — for an added line, ai is where it
// goes in a, and the other way round.
type op struct {
	kind   byte
	ai, bi int
}

func lcsOps(x, y []string) []op {
	// Common ends first: the table is then only as large as the middle.
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	mx, my := x[pre:len(x)-suf], y[pre:len(y)-suf]
	// lcs[i][j] is the length of the longest common subsequence of
	// mx[i:] and my[j:].
	lcs := make([][]int, len(mx)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(my)+1)
	}
	for i := len(mx) - 1; i >= 0; i-- {
		for j := len(my) - 1; j >= 0; j-- {
			if mx[i] == my[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []op
	for k := range pre {
		ops = append(ops, op{' ', k, k})
	}
	i, j := 0, 0
	for i < len(mx) || j < len(my) {
		switch {
		case i < len(mx) && j < len(my) && mx[i] == my[j]:
			ops = append(ops, op{' ', pre + i, pre + j})
			i, j = i+1, j+1
		case i < len(mx) && (j == len(my) || lcs[i+1][j] >= lcs[i][j+1]):
			// Removed lines before added ones, as diff -u writes them.
			ops = append(ops, op{'-', pre + i, pre + j})
			i++
		default:
			ops = append(ops, op{'+', pre + i, pre + j})
			j++
		}
	}
	for k := range suf {
		ops = append(ops, op{' ', len(x) - suf + k, len(y) - suf + k})
	}
	return ops
}
