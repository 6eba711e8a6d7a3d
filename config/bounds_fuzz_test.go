package config

import (
	"testing"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
)

// FuzzBounds checks the bounds of bounds.go against goccy itself, on
// arbitrary small inputs and with small limits: the byte count is an upper
// bound of the lexer's tokens, and a file that passes nestingProblem
// parses into a tree no deeper and no wider than the limits. A bound the
// parser could outgrow would let a hostile file through.
func FuzzBounds(f *testing.F) {
	for _, s := range []string{
		"a: [b, {c: d}]\n",
		"- - - a\n",
		"a:\n  b:\n    c: 1\n  d: 2\n",
		"k:\n- a\n- b\nn: 1\n",
		"? a\n: b\n",
		"a: &x !!str [*x]\n",
		"a: |\n  [[[\nb: '[[['\n",
		"- a: 1\n  b: 2\n- c\n",
		"a: b: c\n",
		"{a: [b: c]}\n",
		"a:\n- - b\n  - c\n",
		"---\na: [\n---\n",
	} {
		f.Add([]byte(s))
	}
	lim := nestLimits{depth: 3, keys: 3}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<12 {
			return
		}
		tks := lexer.Tokenize(string(data))
		if n, _ := tokenBound(data, 1<<30); n < len(tks) {
			t.Fatalf("tokenBound %d < %d tokens", n, len(tks))
		}
		if _, _, problem := nestingProblem(tks, lim); problem != "" {
			return
		}
		file, err := parser.Parse(tks, 0)
		if err != nil {
			return
		}
		for _, d := range file.Docs {
			if d == nil {
				continue
			}
			depth, props, keys := treeShape(d.Body)
			if depth > lim.depth || props > lim.depth || keys > lim.keys {
				t.Fatalf("passed the bounds %+v, but the tree nests %d collections and %d anchors/tags deep, with %d keys in a block mapping", lim, depth, props, keys)
			}
		}
	})
}

// treeShape returns the deepest nesting of mappings and lists, the longest
// chain of anchors and tags, and the most keys of one block mapping.
func treeShape(n ast.Node) (depth, props, keys int) {
	var walk func(n ast.Node, d, p int)
	walk = func(n ast.Node, d, p int) {
		depth, props = max(depth, d), max(props, p)
		switch n := n.(type) {
		case *ast.MappingNode:
			if !n.IsFlowStyle {
				keys = max(keys, len(n.Values))
			}
			for _, mv := range n.Values {
				walk(mv, d+1, 0)
			}
		case *ast.MappingValueNode:
			walk(n.Key, d, 0)
			walk(n.Value, d, 0)
		case *ast.MappingKeyNode:
			walk(n.Value, d, 0)
		case *ast.SequenceNode:
			for _, v := range n.Values {
				walk(v, d+1, 0)
			}
		case *ast.AnchorNode:
			walk(n.Value, d, p+1)
		case *ast.TagNode:
			walk(n.Value, d, p+1)
		}
	}
	walk(n, 0, 0)
	return depth, props, keys
}
