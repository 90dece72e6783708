package results

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the quoted tables and figures of README, TESTING.md and docs/ from the results files")

// The documents that may quote results, relative to this directory: the
// READMEs, TESTING.md, CONTRIBUTING.md and every page of docs/, read (those
// that exist).
func documents(t *testing.T) []document {
	t.Helper()
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []document
	for _, path := range append([]string{"../README.md", "../deploy/README.md", "../TESTING.md", "../CONTRIBUTING.md"}, docs...) {
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, document{path, b})
	}
	return out
}

// document is a page's path (from this directory) and its text.
type document struct {
	path string
	text []byte
}

var (
	blockRE = regexp.MustCompile(`(?s)(<!-- results:([a-z0-9.-]+)#([a-z0-9-]+) -->\n)(.*?)(<!-- /results -->)`)
	figRE   = regexp.MustCompile(`(<!-- fig:([a-z0-9.-]+)#([a-z0-9.-]+) -->)(.*?)(<!-- /fig -->)`)
)

// Every table and figure the pages quote between markers is what its
// results file holds, with the file's date, machine, load and settings above
// each table and "(busy machine)" beside every figure from a busy run; a
// marker naming a file, table or figure that does not exist fails too.
func TestREADMEQuotesResults(t *testing.T) {
	files, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no results files")
	}
	quoted := 0
	for _, page := range documents(t) {
		doc, b := page.path, page.text
		text := string(b)
		var problems []string
		text = blockRE.ReplaceAllStringFunc(text, func(m string) string {
			g := blockRE.FindStringSubmatch(m)
			name, table, have := g[2], g[3], g[4]
			quoted++
			f, ok := files[name]
			if !ok {
				problems = append(problems, "results file "+name+".json does not exist")
				return m
			}
			tab, ok := f.Tables[table]
			if !ok {
				problems = append(problems, name+".json has no table "+table)
				return m
			}
			want := f.LabelFrom(resultsDirFrom(t, doc)) + "\n\n" + Markdown(tab)
			if have != want {
				problems = append(problems, "table "+name+"#"+table+" differs from the results file:\n--- quoted\n"+have+"--- results file\n"+want)
			}
			return g[1] + want + g[5]
		})
		text = figRE.ReplaceAllStringFunc(text, func(m string) string {
			g := figRE.FindStringSubmatch(m)
			name, key, have := g[2], g[3], g[4]
			quoted++
			f, ok := files[name]
			if !ok {
				problems = append(problems, "results file "+name+".json does not exist (figure "+key+")")
				return m
			}
			want, ok := f.Figure(key)
			if !ok {
				problems = append(problems, name+".json has no figure "+key)
				return m
			}
			if have != want {
				problems = append(problems, "figure "+name+"#"+key+": quoted "+have+", results file "+want)
			}
			return g[1] + want + g[5]
		})
		if *update {
			if err := os.WriteFile(doc, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, p := range problems {
			t.Errorf("%s: %s", strings.TrimPrefix(doc, "../"), p)
		}
		if len(problems) > 0 {
			t.Logf("go test ./results -update rewrites %s from the results files", doc)
		}
	}
	if quoted == 0 {
		t.Fatal("no page quotes a results file")
	}
}

// resultsDirFrom is the path from doc's folder to this directory, as a
// Markdown link spells it.
func resultsDirFrom(t *testing.T, doc string) string {
	t.Helper()
	from, err := filepath.Abs(filepath.Dir(doc))
	if err != nil {
		t.Fatal(err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(from, here)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.ToSlash(rel)
}

// A quoted figure is never left unmarked elsewhere in the same document:
// the issue-26 mismatches (a figure quoted twice, once stale) cannot come
// back unnoticed for the figures listed here.
func TestNoStaleCopies(t *testing.T) {
	stale := []string{
		"35 MiB measured", "42.8 MiB steady", "10–12 min", "67–86%", "75 s idle", "14 each", "stops at the start of the last transaction", "connectorLogicalName`, `.taskId` and `.connectorName`",
		"12.6, 6.7 and 5.1", "24–27 MiB",
	}
	for _, page := range documents(t) {
		doc, b := page.path, page.text
		for _, s := range stale {
			if strings.Contains(string(b), s) {
				t.Errorf("%s still says %q", strings.TrimPrefix(doc, "../"), s)
			}
		}
	}
}

func TestParseMarkdownTables(t *testing.T) {
	got := ParseMarkdownTables("x\n| a | b |\n|---|---|\n| 1 | 2 |\n\n| c |\n|:-|\n| 3 |\n")
	if len(got) != 2 || len(got[0]) != 2 || got[0][1][1] != "2" || got[1][1][0] != "3" {
		t.Fatalf("%q", got)
	}
	if Markdown(got[0]) != "| a | b |\n|---|---|\n| 1 | 2 |\n" {
		t.Fatalf("%q", Markdown(got[0]))
	}
}
