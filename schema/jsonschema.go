package schema

import (
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// compileJSONSchema compiles a registry's JSON schema. It loads nothing from
// the network or the file system: a schema's $ref must stay inside it.
func compileJSONSchema(id int, text string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	url := fmt.Sprintf("registry:///schemas/ids/%d", id)
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("outboxd does not load %s: a registry's JSON schema must be self-contained", url)
}

var english = message.NewPrinter(language.English)

// validateJSON checks v against s; a failure is a *mismatch at the deepest
// first failing location, with the validator's full text as its detail.
func validateJSON(s *jsonschema.Schema, v any) error {
	err := s.Validate(v)
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	leaf := ve
	for len(leaf.Causes) > 0 {
		leaf = leaf.Causes[0]
	}
	kw := strings.Join(leaf.ErrorKind.KeywordPath(), "/")
	return &mismatch{
		path:   strings.Join(leaf.InstanceLocation, "."),
		msg:    "fails the JSON schema's " + kw,
		detail: leaf.ErrorKind.LocalizedString(english),
	}
}

// detail is the message a mismatch's field error leaves out of Error() (it
// may quote the value): the relay logs it and puts it in a dead letter's
// outboxd.error header, never on /readyz.
func detail(err error) string {
	var m *mismatch
	if errors.As(err, &m) {
		return m.detail
	}
	return ""
}
