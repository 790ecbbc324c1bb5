package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// EncodeDocument returns doc's compact JSON encoding, the form
// DecodeDocument reads back: what a control plane that has parsed a
// ruleset publishes beside its source, so that each receiver decodes it
// without parsing YAML.
func EncodeDocument(doc *Document) ([]byte, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("rules: encode document: %w", err)
	}
	return b, nil
}

// DecodeDocument decodes a Document from EncodeDocument's form, strictly:
// an unknown field, a value of the wrong type, a second value or trailing
// bytes is an error, and so is anything but one JSON object. source is the
// text the document was parsed from: the ruleset Compile makes of the
// result has source's Hash, as if Parse had read source. Like Parse, it
// does not validate (see Compile); unlike Parse, its errors name no line,
// so a receiver that must report a problem precisely parses source
// instead.
func DecodeDocument(data, source []byte) (*Document, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, errors.New("rules: decode document: not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("rules: decode document: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("rules: decode document: trailing data after the object")
	}
	sum := sha256.Sum256(source)
	doc.hash = hex.EncodeToString(sum[:])
	return &doc, nil
}
