package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Every option has one name, used three ways: --name on the command line,
// OUTBOXD_NAME in the environment, and name (dots for nesting: kafka.brokers
// is "kafka: {brokers: …}") in the YAML file given by --config. Command line
// wins over environment, environment over the file, the file over defaults.

// envName maps an option name to its environment variable.
func envName(name string) string {
	return "OUTBOXD_" + strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(name))
}

// optionSet wraps a FlagSet with environment and file sources.
type optionSet struct {
	fs *flag.FlagSet
	// sections are YAML keys whose whole subtree goes to a consumer (the
	// router's "router" and "tables"), not to flags.
	sections     map[string]any
	sectionNames []string
}

func newOptionSet(cmd string, sections ...string) *optionSet {
	fs := flag.NewFlagSet("outboxd "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &optionSet{fs: fs, sections: map[string]any{}, sectionNames: sections}
}

// parse applies the command line, then OUTBOXD_* variables and the config file
// for options the command line left alone.
func (o *optionSet) parse(args []string, getenv func(string) string) error {
	if err := o.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w (see outboxd %s --help)", o.flagError(err), strings.TrimPrefix(o.fs.Name(), "outboxd "))
	}
	if o.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", o.fs.Arg(0))
	}
	set := map[string]bool{}
	o.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	file := map[string]fileValue{}
	if cf := o.fs.Lookup("config"); cf != nil {
		path := cf.Value.String()
		if !set["config"] && getenv(envName("config")) != "" {
			path = getenv(envName("config"))
		}
		if path != "" {
			var err error
			if file, err = o.loadFile(path); err != nil {
				return err
			}
		}
	}
	var errs []error
	o.fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || f.Name == "config" {
			return
		}
		src, v := "", ""
		if ev := getenv(envName(f.Name)); ev != "" {
			src, v = envName(f.Name), ev
		} else if fv, ok := file[f.Name]; ok {
			src, v = "config file key "+fv.key, fv.value
		} else {
			return
		}
		if err := f.Value.Set(v); err != nil {
			if why := durationError(f, v); why != "" {
				err = errors.New(why)
			}
			errs = append(errs, fmt.Errorf("invalid value %q for %s (--%s): %w", v, src, f.Name, err))
		}
	})
	return errors.Join(append(errs, negativeDurations(o.fs)...)...)
}

// negativeDurations refuses a negative value for every duration option of
// any command, wherever it came from: Go's parser accepts "-2ms", and no
// interval, timeout or linger of outboxd means anything below zero. (A
// missing unit, "5", is already refused by the parser.) Which options must
// be positive rather than merely not negative is each command's validate.
func negativeDurations(fs *flag.FlagSet) []error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if d, ok := g.Get().(time.Duration); ok && d < 0 {
				errs = append(errs, fmt.Errorf("--%s must not be negative (got %s); durations take a unit: 500ms, 30s, 1m", f.Name, d))
			}
		}
	})
	return errs
}

var flagValueErr = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): (.*)$`)

// flagError says --name rather than the flag package's -name, and why a
// duration did not parse where the flag package only says "parse error".
func (o *optionSet) flagError(err error) error {
	m := flagValueErr.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	value, name, why := m[1], m[2], m[3]
	if f := o.fs.Lookup(name); f != nil {
		if d := durationError(f, value); d != "" {
			why = d
		}
	}
	return fmt.Errorf("invalid value %q for --%s: %s", value, name, why)
}

// durationError is why v is no duration, if f is a duration option ("" if
// it is not, or v parses).
func durationError(f *flag.Flag, v string) string {
	if g, ok := f.Value.(flag.Getter); ok {
		if _, ok := g.Get().(time.Duration); ok {
			if _, err := time.ParseDuration(v); err != nil {
				return strings.TrimPrefix(err.Error(), "time: ") + " (durations take a unit: 500ms, 30s, 1m)"
			}
		}
	}
	return ""
}

// fileValue is an option's value from the config file, and the key it had there.
type fileValue struct{ value, key string }

// loadFile flattens a YAML file into option names. Unknown keys are errors.
func (o *optionSet) loadFile(path string) (map[string]fileValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(data, &tree); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := map[string]fileValue{}
	var unknown []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			name := prefix + k
			if prefix == "" && slices.Contains(o.sectionNames, k) {
				o.sections[k] = v
				continue
			}
			if sub, ok := v.(map[string]any); ok {
				walk(name+".", sub)
				continue
			}
			flagName := strings.ReplaceAll(name, ".", "-")
			if o.fs.Lookup(flagName) == nil || flagName == "config" {
				unknown = append(unknown, name)
				continue
			}
			out[flagName] = fileValue{value: scalar(v), key: name}
		}
	}
	walk("", tree)
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("config file %s: unknown key(s) %s (see outboxd run --help)", path, strings.Join(unknown, ", "))
	}
	return out, nil
}

func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = scalar(e)
		}
		return strings.Join(parts, ",")
	default:
		return fmt.Sprint(v)
	}
}

// parseOrHelp is parse, and on --help prints the command's usage with its
// summary to w; the caller returns the error as it is (flag.ErrHelp exits 0).
func (o *optionSet) parseOrHelp(args []string, getenv func(string) string, w io.Writer, summary string) error {
	err := o.parse(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		o.usage(w, summary)
	}
	return err
}

// usage prints every option with its default and environment variable.
func (o *optionSet) usage(w io.Writer, summary string) {
	sources := "the environment variable shown"
	if o.fs.Lookup("config") != nil {
		sources += ", and from the --config YAML file"
	}
	fmt.Fprintf(w, "Usage: %s [options]\n\n%s\n\nOptions (each also read from %s):\n", o.fs.Name(), summary, sources)
	o.fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "  --%s  [%s]%s\n      %s\n", f.Name, envName(f.Name), def, f.Usage)
	})
}

// listValue is a comma-separated list flag.
type listValue []string

func (l *listValue) String() string { return strings.Join(*l, ",") }

func (l *listValue) Set(s string) error {
	*l = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// choiceValue accepts one of a fixed set of words.
type choiceValue struct {
	v       *string
	choices []string
}

func (c choiceValue) String() string {
	if c.v == nil {
		return ""
	}
	return *c.v
}

func (c choiceValue) Set(s string) error {
	if !slices.Contains(c.choices, s) {
		return fmt.Errorf("must be one of %s", strings.Join(c.choices, ", "))
	}
	*c.v = s
	return nil
}

func (o *optionSet) choice(p *string, name, def, usage string, choices ...string) {
	*p = def
	shown := slices.DeleteFunc(slices.Clone(choices), func(c string) bool { return c == "" })
	o.fs.Var(choiceValue{p, choices}, name, usage+" ("+strings.Join(shown, "|")+")")
}

// keyValues is a repeatable key=value flag (--topic-config a=1 --topic-config
// b=2); from the environment or the config file, pairs are comma-separated.
type keyValues map[string]string

func (kv keyValues) String() string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + kv[k]
	}
	return strings.Join(parts, ",")
}

func (kv keyValues) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("%q is not key=value", p)
		}
		kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return nil
}
