package timebox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestExportedNamesHaveDocComments: a library user reads godoc, not
// docs/events.md, so every exported type, function, method of an exported
// type, const, var and struct field of an exported struct in a public
// package (everything outside internal/, examples/, bench/, testdata/ and
// package main) has a doc comment. A field is documented by its own doc or
// line comment, or by the doc comment of the field that opens its line
// group (fields on consecutive lines) when that comment names it, as in
// "// Start and End say …". It parses the sources; it needs no build.
func TestExportedNamesHaveDocComments(t *testing.T) {
	var missing []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch base := d.Name(); {
			case path == ".":
			case base == "internal" || base == "examples" || base == "bench" || base == "testdata",
				strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_"):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		missing = append(missing, undocumented(fset, f)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range missing {
		t.Errorf("%s has no doc comment", m)
	}
	if len(missing) > 0 {
		t.Logf("%d exported names have no doc comment", len(missing))
	}
}

// undocumented lists, as "file:line: kind name", the exported names of f
// that have no doc comment.
func undocumented(fset *token.FileSet, f *ast.File) []string {
	var out []string
	report := func(pos token.Pos, kind, name string) {
		out = append(out, fset.Position(pos).String()+": "+kind+" "+name)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv == nil {
				report(d.Pos(), "func", d.Name.Name)
			} else if recv := receiverName(d.Recv.List[0].Type); ast.IsExported(recv) {
				report(d.Pos(), "method", recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if d.Doc == nil && s.Doc == nil && s.Comment == nil {
						report(s.Pos(), "type", s.Name.Name)
					}
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, name := range undocumentedFields(fset, st) {
							report(name.Pos(), "field", s.Name.Name+"."+name.Name)
						}
					}
				case *ast.ValueSpec:
					if d.Doc != nil || s.Doc != nil || s.Comment != nil {
						continue
					}
					for _, n := range s.Names {
						if n.IsExported() {
							report(n.Pos(), d.Tok.String(), n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// undocumentedFields returns the exported, named fields of st that have
// neither a comment of their own nor one shared with their line group.
func undocumentedFields(fset *token.FileSet, st *ast.StructType) []*ast.Ident {
	var out []*ast.Ident
	var groupDoc string // the doc comment opening the current line group
	prevEnd := -1       // the line the previous field ends on
	for _, fld := range st.Fields.List {
		line := fset.Position(fld.Pos()).Line
		if fld.Doc != nil {
			groupDoc = fld.Doc.Text()
		} else if line != prevEnd+1 {
			groupDoc = ""
		}
		prevEnd = fset.Position(fld.End()).Line
		if fld.Doc != nil || fld.Comment != nil {
			continue
		}
		for _, n := range fld.Names {
			if n.IsExported() && !namesWord(groupDoc, n.Name) {
				out = append(out, n)
			}
		}
	}
	return out
}

// namesWord reports whether text holds word as a whole word.
func namesWord(text, word string) bool {
	return text != "" && regexp.MustCompile(`\b`+regexp.QuoteMeta(word)+`\b`).MatchString(text)
}

// receiverName is the name of a method's receiver type, without its
// pointer or type parameters.
func receiverName(expr ast.Expr) string {
	for {
		switch e := expr.(type) {
		case *ast.StarExpr:
			expr = e.X
		case *ast.IndexExpr:
			expr = e.X
		case *ast.IndexListExpr:
			expr = e.X
		case *ast.ParenExpr:
			expr = e.X
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}
