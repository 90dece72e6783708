package results

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	fenceRE   = regexp.MustCompile("(?m)^\\s*```")
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#+ (.*)$`)
	codeRE    = regexp.MustCompile("(?s)```.*?```")
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// The pages README links to are whole: every code fence is closed (an
// unclosed one swallows the rest of the page), and every relative link
// names a file that exists and, for a Markdown file, a heading it has. The
// README was cut into docs/ pages: this is what keeps their links honest.
func TestDocsFencesAndLinks(t *testing.T) {
	for _, page := range documents(t) {
		doc, b := page.path, page.text
		name := strings.TrimPrefix(doc, "../")
		if n := len(fenceRE.FindAllIndex(b, -1)); n%2 != 0 {
			t.Errorf("%s: %d code fences, an odd number: one is not closed", name, n)
		}
		text := codeRE.ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := doc
			if path != "" {
				file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %s: %v", name, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(file, ".md") && !hasAnchor(t, file, frag) {
				t.Errorf("%s: link %s: %s has no heading with that anchor", name, target, filepath.Base(file))
			}
		}
	}
}

// hasAnchor reports whether a Markdown file has a heading whose GitHub
// anchor is frag.
func hasAnchor(t *testing.T, file, frag string) bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range headingRE.FindAllStringSubmatch(codeRE.ReplaceAllString(string(b), ""), -1) {
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), ""), " ", "-")
		if slug == frag {
			return true
		}
	}
	return false
}
