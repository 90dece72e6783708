package outboxd

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docs/architecture.md names files, folders and Go declarations in
// backquotes; each must exist, so that the map cannot drift from the code
// unnoticed. A path is a backquoted word ending in .go, .md or / (relative
// to the repository's root); a Go name is a camelCase word, optionally
// qualified: pkg.Name, pkg.Type.Method, Type.Method (any package).
func TestArchitectureNamesExist(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	decls := goDecls(t)
	text := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(doc), "") // the embedding example
	pathRE := regexp.MustCompile(`^[A-Za-z0-9_./-]+(\.go|\.md|/)$`)
	nameRE := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*){0,2}$`)
	checked := 0
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(text, -1) {
		w := m[1]
		switch {
		case pathRE.MatchString(w):
			if _, err := os.Stat(filepath.FromSlash(strings.TrimSuffix(w, "/"))); err != nil {
				t.Errorf("docs/architecture.md names %s, which does not exist", w)
			}
		case nameRE.MatchString(w):
			if !decls[w] {
				t.Errorf("docs/architecture.md names %s, which no Go file declares", w)
			}
		default:
			continue
		}
		checked++
	}
	if checked < 50 {
		t.Fatalf("checked only %d names: is the page's format still what this test reads?", checked)
	}
}

// goDecls is every declaration of the repository's non-test Go files, by
// the names the page may use: Name and pkg.Name for a type, function,
// variable or constant; Type.Method and pkg.Type.Method for a method
// (interfaces' too).
func goDecls(t *testing.T) map[string]bool {
	t.Helper()
	decls := map[string]bool{}
	add := func(pkg string, names ...string) {
		n := strings.Join(names, ".")
		decls[n], decls[pkg+"."+n] = true, true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(pkg, d.Name.Name)
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					add(pkg, id.Name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(pkg, s.Name.Name)
						if it, ok := s.Type.(*ast.InterfaceType); ok {
							for _, m := range it.Methods.List {
								for _, n := range m.Names {
									add(pkg, s.Name.Name, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(pkg, n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return decls
}
