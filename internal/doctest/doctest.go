// Package doctest keeps the reference documentation (docs/*.md) true to
// the code: tests generate parts of a page from the code's own tables and
// fail when the committed page differs, and read the examples a page shows
// so that they can be run.
//
// A generated part sits between two HTML comments, which Markdown does not
// show:
//
//	<!-- begin keys -->
//	...
//	<!-- end keys -->
//
// Part compares what is between them with what the code says, or with
// update (each package's -update test flag) rewrites it.
package doctest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Part checks that the part name of the page at path holds content (a
// newline is added when it lacks one), or rewrites it when update is set.
// how is the command that regenerates the page, for the failure message.
func Part(t testing.TB, path, name, content string, update bool, how string) {
	t.Helper()
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	got, err := Replace(string(page), name, content)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if got == string(page) {
		return
	}
	if update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, _ := Get(string(page), name)
	t.Errorf("%s: the part %q is not what the code says; regenerate it with %s\n%s", path, name, how, Diff(old, content))
}

func markers(name string) (begin, end string) {
	return "<!-- begin " + name + " -->\n", "<!-- end " + name + " -->"
}

// Get returns the part name of page.
func Get(page, name string) (string, error) {
	begin, end := markers(name)
	i := strings.Index(page, begin)
	if i < 0 {
		return "", fmt.Errorf("no %q line", strings.TrimSpace(begin))
	}
	rest := page[i+len(begin):]
	j := strings.Index(rest, end)
	if j < 0 {
		return "", fmt.Errorf("no %q line after %q", end, strings.TrimSpace(begin))
	}
	return rest[:j], nil
}

// Replace returns page with the part name replaced by content.
func Replace(page, name, content string) (string, error) {
	begin, end := markers(name)
	i := strings.Index(page, begin)
	if i < 0 {
		return "", fmt.Errorf("no %q line", strings.TrimSpace(begin))
	}
	start := i + len(begin)
	j := strings.Index(page[start:], end)
	if j < 0 {
		return "", fmt.Errorf("no %q line after %q", end, strings.TrimSpace(begin))
	}
	return page[:start] + content + page[start+j:], nil
}

// Diff shows the first lines where want and got differ, for a failure
// message that points at the change without printing the whole page.
func Diff(old, new string) string {
	a, b := strings.Split(old, "\n"), strings.Split(new, "\n")
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf("first difference, line %d of the part:\n  committed: %s\n  code says: %s", i+1, x, y)
		}
	}
	return "(they differ only in line endings)"
}

// Block is one fenced code block of a page.
type Block struct {
	// Lang is the word after the opening fence (jsonl, yaml, sh).
	Lang string
	// Line is the page's line number of the block's first line of text.
	Line int
	Text string
}

// Blocks returns the fenced code blocks (```lang ... ```) of a page.
func Blocks(page []byte) []Block {
	var out []Block
	var cur *Block
	var text bytes.Buffer
	for i, line := range strings.Split(string(page), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &Block{Lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), Line: i + 2}
			text.Reset()
		case cur != nil && trimmed == "```":
			cur.Text = text.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			text.WriteString(line)
			text.WriteByte('\n')
		}
	}
	return out
}

// Consts returns the values of the string constants of type typ that the
// Go package in dir declares (test files aside), in the order of its files
// and declarations: the package's own list of its event types, statuses or
// error codes, read from its source so that a page can be checked against
// every one, including one added tomorrow.
func Consts(dir, typ string) ([]string, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						out = append(out, s)
					}
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no constants of type %s in %s", typ, dir)
	}
	return out, nil
}

// Calls returns the string literal that is argument arg (from 0) of every
// call of the function or method named fn in the Go package in dir (test
// files aside): the routes a mux registers, the error codes a handler
// writes.
func Calls(dir, fn string, arg int) ([]string, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) <= arg {
				return true
			}
			name := ""
			switch f := call.Fun.(type) {
			case *ast.Ident:
				name = f.Name
			case *ast.SelectorExpr:
				name = f.Sel.Name
			}
			if name != fn {
				return true
			}
			if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				out = append(out, s)
			}
			return true
		})
	}
	sort.Strings(out)
	return out, nil
}

// parseDir parses the Go files of the package in dir, test files aside, in
// the order of their names.
func parseDir(dir string) ([]*ast.File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}
