// Package results is the one source of every figure README.md,
// deploy/README.md, TESTING.md and docs/ quote: each run of make bench, make soak or a measuring
// test is a JSON file in this directory (date, machine, load, settings, the
// tables and figures it measured), and the pages quote those files
// between markers that TestREADMEQuotesResults checks, so that a figure in
// the text and the run it came from cannot disagree.
//
// A table is quoted as
//
//	<!-- results:bench-2026-12-01-busy#main -->
//	…generated: a label line (date, machine, load, settings) and the table…
//	<!-- /results -->
//
// and a single figure inline as <!-- fig:soak-2026-12-01#kfake-alo-wall -->9 min 29 s<!-- /fig -->.
// A figure from a busy machine carries "(busy machine)" beside it, and a
// table from one a label line saying so, both generated: busy runs cannot be
// quoted without the label. `go test ./results -update` rewrites the quoted
// text from the files.
package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// File is one run's results.
type File struct {
	// Name is the file's base name without .json: how the pages refer to it.
	Name string `json:"name"`
	// Source is what wrote it: "make bench", "make soak", a test's name.
	Source string `json:"source"`
	// Date is when the run started (RFC 3339, UTC), or the day only
	// (2026-12-01) where the run's time is not known.
	Date string `json:"date"`
	// Machine: cores, CPU, memory, kernel, Go, PostgreSQL, Java.
	Machine string `json:"machine"`
	// Load: the load average during the run, and whether others shared
	// the machine. Busy is true when they did: every figure is labelled.
	Load string `json:"load"`
	Busy bool   `json:"busy"`
	// Settings: the command line, broker, options that differ from the
	// defaults.
	Settings string `json:"settings"`
	// Commit is the git commit of the code that ran (Commit's form:
	// abbreviated or full hash, "-dirty" when the tree had uncommitted
	// changes). With Source it names what wrote the file: a results file
	// is written by the program that measured, never by hand.
	Commit string `json:"commit"`
	// Seeded marked files written by hand from figures quoted before the
	// results directory existed. Load refuses them: a figure must come
	// from the run that measured it.
	Seeded string `json:"seeded,omitempty"`
	// Tables by name: the first row is the header.
	Tables map[string][][]string `json:"tables,omitempty"`
	// Figures by key: one value each, as the text quotes it.
	Figures map[string]string `json:"figures,omitempty"`
	// Notes: anything a reader of the figures must know.
	Notes []string `json:"notes,omitempty"`
}

// Label is the line printed above a quoted table in a document at the
// repository's root; LabelFrom is the same for a document elsewhere.
func (f *File) Label() string { return f.LabelFrom("results") }

// LabelFrom is the line printed above a quoted table, its link to the
// results file relative to the quoting document: dir is the path from that
// document's folder to this one ("results" from the root, "../results" from
// docs/).
func (f *File) LabelFrom(dir string) string {
	var b strings.Builder
	if f.Busy {
		b.WriteString("**Busy machine** (figures skewed by other tenants): ")
	}
	fmt.Fprintf(&b, "%s, `%s` at commit %s; %s; %s; %s.", f.Date, f.Source, f.Commit, f.Machine, f.Load, f.Settings)
	fmt.Fprintf(&b, " Source: [results/%s.json](%s/%s.json).", f.Name, dir, f.Name)
	return b.String()
}

// Figure is figure key as the text quotes it, with the busy-machine label.
func (f *File) Figure(key string) (string, bool) {
	v, ok := f.Figures[key]
	if !ok {
		return "", false
	}
	if f.Busy {
		v += " (busy machine)"
	}
	return v, true
}

// Load reads every results file of dir, by name.
func Load(dir string) (map[string]*File, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := map[string]*File{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var f File
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if want := strings.TrimSuffix(filepath.Base(p), ".json"); f.Name != want {
			return nil, fmt.Errorf("%s: name %q, want %q (the file's base name)", p, f.Name, want)
		}
		if err := f.validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out[f.Name] = &f
	}
	return out, nil
}

func (f *File) validate() error {
	var missing []string
	for k, v := range map[string]string{"source": f.Source, "date": f.Date, "machine": f.Machine, "load": f.Load, "settings": f.Settings} {
		if strings.TrimSpace(v) == "" {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: every results file says when, where, under what load and with which settings it was measured", strings.Join(missing, ", "))
	}
	if f.Seeded != "" {
		return fmt.Errorf("seeded by hand (%s): a results file is written by the program that measured (make bench, make soak, a measuring test with -results), never by hand; re-run it, or drop the figures that quote it", f.Seeded)
	}
	if !commitRE.MatchString(f.Commit) {
		return fmt.Errorf("commit %q: every results file names the commit of the code that wrote it (a git hash, -dirty for a tree with changes; results.Commit gives it)", f.Commit)
	}
	if _, err := time.Parse(time.RFC3339, f.Date); err != nil {
		if _, err := time.Parse("2006-01-02", f.Date); err != nil {
			return fmt.Errorf("date %q is neither RFC 3339 nor YYYY-MM-DD", f.Date)
		}
	}
	for name, t := range f.Tables {
		for i, r := range t {
			if len(r) != len(t[0]) {
				return fmt.Errorf("table %s row %d has %d cells, the header %d", name, i, len(r), len(t[0]))
			}
		}
	}
	return nil
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{7,40}(-dirty)?$`)

// Commit is the checkout's commit for File.Commit: `git rev-parse HEAD`,
// abbreviated, with "-dirty" when the tree has uncommitted changes to
// tracked files (the run measured code no commit holds). "unknown" outside
// a git checkout, which Load then refuses.
func Commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "-dirty"
	}
	return c
}

// Write writes f as dir/<f.Name>.json.
func Write(dir string, f *File) (string, error) {
	if err := f.validate(); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, f.Name+".json")
	return p, os.WriteFile(p, append(b, '\n'), 0o644)
}

// Markdown renders a table: header, separator, rows.
func Markdown(t [][]string) string {
	var b strings.Builder
	for i, r := range t {
		b.WriteString("|")
		for _, c := range r {
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
		if i == 0 {
			b.WriteString("|")
			for range r {
				b.WriteString("---|")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// ParseMarkdownTables returns every pipe table of text (lines starting with
// "|"), cells trimmed, separator rows dropped: how make bench's printed
// table becomes a results file.
func ParseMarkdownTables(text string) [][][]string {
	var out [][][]string
	var cur [][]string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
			cur = nil
		}
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			flush()
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		sep := true
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
			if strings.Trim(cells[i], "-: ") != "" || utf8.RuneCountInString(cells[i]) == 0 {
				sep = false
			}
		}
		if !sep {
			cur = append(cur, cells)
		}
	}
	flush()
	return out
}
