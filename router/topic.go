package router

import (
	"fmt"
	"regexp"
	"regexp/syntax"
)

// topicRule is Kafka's RegexRouter as the Outbox Event Router configures it:
// if route.topic.regex matches the whole routing value (Java's
// Matcher.matches), the topic is route.topic.replacement with its group
// references expanded (Matcher.replaceFirst); otherwise the topic is the raw
// value. Either way the result must be a valid Kafka topic name.
type topicRule struct {
	re    *regexp.Regexp // anchored: ^(?:regex)$
	parts []replPart
	// whole: the regex is "(?<name>.*)"-like: it matches every value
	// without a newline (every value if dotNL), and every group the
	// replacement refers to is the whole value. Topic = parts with the value
	// spliced in, no regex run.
	whole  bool
	dotNL  bool
	static string // the replacement has no group refs: the topic on a match
	cache  map[string]string
}

// replPart is a literal (group < 0) or a reference to a capture group.
type replPart struct {
	lit   string
	group int
}

type topicRuleError struct{ key, msg string }

func (e *topicRuleError) Error() string { return e.key + ": " + e.msg }

func compileTopicRule(regex, replacement string) (*topicRule, error) {
	re, err := regexp.Compile(`^(?:` + regex + `)$`)
	if err != nil {
		if _, err2 := regexp.Compile(regex); err2 != nil {
			err = err2
		}
		return nil, &topicRuleError{optTopicRegex, fmt.Sprintf("invalid regex %q: %v", regex, err)}
	}
	parts, err := parseReplacement(replacement, re)
	if err != nil {
		return nil, &topicRuleError{optTopicReplace, fmt.Sprintf("%q: %v", replacement, err)}
	}
	t := &topicRule{re: re, parts: parts, cache: make(map[string]string)}
	// Every literal ends up in every topic a match produces: reject
	// characters Kafka would refuse up front.
	refs := false
	for _, p := range parts {
		if p.group >= 0 {
			refs = true
			continue
		}
		for i := 0; i < len(p.lit); i++ {
			if !topicChar(p.lit[i]) {
				return nil, &topicRuleError{optTopicReplace, fmt.Sprintf("%q: character %q is not allowed in a Kafka topic name ([a-zA-Z0-9._-])", replacement, p.lit[i])}
			}
		}
	}
	if !refs {
		for _, p := range parts {
			t.static += p.lit
		}
		if !validTopic(t.static) {
			return nil, &topicRuleError{optTopicReplace, fmt.Sprintf("%q is not a valid Kafka topic name", replacement)}
		}
	}
	if dotNL, ok := matchesWholeValue(regex); ok {
		t.whole, t.dotNL = true, dotNL
		for _, p := range parts {
			if p.group > 1 {
				t.whole = false
			}
		}
	}
	return t, nil
}

// matchesWholeValue reports whether regex is ".*" or a capture of ".*" (e.g.
// Debezium's default "(?<routedByValue>.*)"), so that group 0 and group 1 are
// the whole value whenever it matches. dotNL: "." also matches newlines.
func matchesWholeValue(regex string) (dotNL bool, ok bool) {
	re, err := syntax.Parse(regex, syntax.Perl)
	if err != nil {
		return false, false
	}
	if re.Op == syntax.OpCapture {
		if len(re.Sub) != 1 {
			return false, false
		}
		re = re.Sub[0]
	}
	if re.Op != syntax.OpStar || len(re.Sub) != 1 || re.Flags&syntax.NonGreedy != 0 {
		return false, false
	}
	switch re.Sub[0].Op {
	case syntax.OpAnyCharNotNL:
		return false, true
	case syntax.OpAnyChar:
		return true, true
	}
	return false, false
}

// parseReplacement parses a java.util.regex.Matcher replacement string:
// "$n" (the longest group number that exists), "${name}", and "\" quoting
// the next character. Anything else is literal.
func parseReplacement(s string, re *regexp.Regexp) ([]replPart, error) {
	var parts []replPart
	var lit []byte
	flush := func() {
		if len(lit) > 0 {
			parts = append(parts, replPart{lit: string(lit), group: -1})
			lit = lit[:0]
		}
	}
	groups := re.NumSubexp()
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case '\\':
			i++
			if i == len(s) {
				return nil, fmt.Errorf("character to be escaped is missing")
			}
			lit = append(lit, s[i])
			i++
		case '$':
			i++
			if i == len(s) {
				return nil, fmt.Errorf("illegal group reference: group index is missing")
			}
			var g int
			if s[i] == '{' {
				i++
				start := i
				for i < len(s) && isNameChar(s[i]) {
					i++
				}
				if i == len(s) || s[i] != '}' {
					return nil, fmt.Errorf("named capturing group is missing trailing '}'")
				}
				name := s[start:i]
				i++
				if name == "" {
					return nil, fmt.Errorf("named capturing group has 0 length name")
				}
				if isDigit(name[0]) {
					return nil, fmt.Errorf("capturing group name {%s} starts with digit character", name)
				}
				if g = re.SubexpIndex(name); g < 0 {
					return nil, fmt.Errorf("no group with name {%s} in route.topic.regex", name)
				}
			} else {
				if !isDigit(s[i]) {
					return nil, fmt.Errorf("illegal group reference")
				}
				g = int(s[i] - '0')
				if g > groups {
					return nil, fmt.Errorf("no group %d in route.topic.regex", g)
				}
				i++
				for i < len(s) && isDigit(s[i]) {
					next := g*10 + int(s[i]-'0')
					if next > groups {
						break
					}
					g = next
					i++
				}
			}
			flush()
			parts = append(parts, replPart{group: g})
		default:
			lit = append(lit, c)
			i++
		}
	}
	flush()
	return parts, nil
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isDigit(c) || c == '_'
}

// topic returns the topic for a routing value, or "" if the result is not a
// valid Kafka topic name. Results are cached per value (bounded), so the
// usual case costs one map lookup and no allocation.
func (t *topicRule) topic(value []byte) string {
	if s, ok := t.cache[string(value)]; ok {
		return s
	}
	s := t.compute(value)
	if s == "" {
		return ""
	}
	if len(t.cache) >= maxTopicCacheItems {
		clear(t.cache)
	}
	t.cache[string(value)] = s
	return s
}

func (t *topicRule) compute(value []byte) string {
	var buf []byte
	switch {
	case t.whole:
		if !t.dotNL && containsNL(value) {
			buf = value // no match: the raw value
			break
		}
		if t.static != "" {
			return t.static
		}
		for _, p := range t.parts {
			if p.group < 0 {
				buf = append(buf, p.lit...)
			} else {
				buf = append(buf, value...)
			}
		}
	default:
		m := t.re.FindSubmatchIndex(value)
		if m == nil {
			buf = value
			break
		}
		if t.static != "" {
			return t.static
		}
		for _, p := range t.parts {
			if p.group < 0 {
				buf = append(buf, p.lit...)
			} else if m[2*p.group] >= 0 {
				buf = append(buf, value[m[2*p.group]:m[2*p.group+1]]...)
			}
		}
	}
	if !validTopicBytes(buf) {
		return ""
	}
	return string(buf)
}

func containsNL(b []byte) bool {
	for _, c := range b {
		if c == '\n' {
			return true
		}
	}
	return false
}

// maxTopicLen is Kafka's limit on topic names.
const maxTopicLen = 249

func topicChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isDigit(c) || c == '.' || c == '_' || c == '-'
}

func validTopic(s string) bool { return validTopicBytes([]byte(s)) }

func validTopicBytes(b []byte) bool {
	if len(b) == 0 || len(b) > maxTopicLen || string(b) == "." || string(b) == ".." {
		return false
	}
	for _, c := range b {
		if !topicChar(c) {
			return false
		}
	}
	return true
}

// ValidTopic checks name the way Kafka does: 1 to 249 characters of
// [a-zA-Z0-9._-], and neither "." nor "..". Use it for topics the router does
// not compute, such as a dead-letter topic.
func ValidTopic(name string) error {
	if !validTopic(name) {
		return fmt.Errorf("%q is not a valid Kafka topic name (1-249 characters of [a-zA-Z0-9._-], not \".\" or \"..\")", name)
	}
	return nil
}
