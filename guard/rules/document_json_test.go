package rules

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

// documentSources are valid rules documents of every kind of field.
func documentSources(t testing.TB) map[string][]byte {
	t.Helper()
	cfg, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"spec example": []byte(specExample),
		"match rules":  []byte(matchRules),
		"replaces":     []byte(replaceRules),
		"example file": cfg,
		"regions": []byte("regions: [{name: eu, weight: 0.5}, {name: us, weight: 0.25}]\n" +
			"rules:\n  - {id: a, algorithm: fixed_window, limit: 7, window: 1s, regions: global}\n"),
		"overrides and keys": []byte("keys: {k: {tier: t}}\nrules:\n" +
			"  - {id: a, algorithm: gcra, limit: 3, window: 1d1h1m1s1ms, burst: 7, overrides: {k: {limit: 9}}}\n"),
		"json": []byte(`{"version":4,"rules":[{"id":"a","capacity":5,"refill_rate":"0.5","cost":2,"match":{"endpoint":"/x","methods":["GET"],"anonymous":false}}]}`),
	}
}

// TestDocumentRoundTrip: a document parsed from its source, encoded
// (EncodeDocument) and decoded (DecodeDocument) compiles to the same
// ruleset as the source itself — the same rules, parameters, matchers,
// hash and version — and encodes to the same bytes again.
func TestDocumentRoundTrip(t *testing.T) {
	t.Parallel()
	for name, src := range documentSources(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			doc, err := Parse(src)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Compile(doc)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := EncodeDocument(doc)
			if err != nil {
				t.Fatal(err)
			}
			back, err := DecodeDocument(enc, src)
			if err != nil {
				t.Fatalf("DecodeDocument(%s): %v", enc, err)
			}
			got, err := Compile(back)
			if err != nil {
				t.Fatalf("the decoded document does not compile: %v", err)
			}
			if got.Hash() != want.Hash() || got.Version() != want.Version() {
				t.Errorf("hash %s, version %d; want %s, %d (the source's)", got.Hash(), got.Version(), want.Hash(), want.Version())
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("the decoded document compiles to another ruleset than its source:\n%+v\nwant\n%+v", got, want)
			}
			again, err := EncodeDocument(back)
			if err != nil || !bytes.Equal(again, enc) {
				t.Errorf("encoded again: %s, %v; want %s", again, err, enc)
			}
		})
	}
}

func TestDecodeDocumentRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "not a JSON object"},
		{"null", "null", "not a JSON object"},
		{"array", `[{"rules":[]}]`, "not a JSON object"},
		{"YAML", "rules: []", "not a JSON object"},
		{"unknown field", `{"rules":[{"id":"a","capacity":1,"rate":"1/s","colour":"red"}]}`, "unknown field"},
		{"wrong type", `{"rules":[{"id":"a","capacity":"many"}]}`, "cannot unmarshal"},
		{"fraction", `{"rules":[{"id":"a","capacity":1.5}]}`, "cannot unmarshal"},
		{"trailing", `{"rules":[]} {}`, "trailing data"},
		{"truncated", `{"rules":[{"id":"a"`, "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc, err := DecodeDocument([]byte(tc.in), []byte("source"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "rules: decode document: ") {
				t.Fatalf("DecodeDocument(%q) = %v, %v; want an error saying %q", tc.in, doc, err, tc.want)
			}
		})
	}
}

// FuzzDocument: DecodeDocument never panics, whatever it is given, and
// what it accepts compiles (or is refused) without a panic and encodes
// stably; a source Parse accepts, encoded and decoded, compiles exactly as
// the source does.
func FuzzDocument(f *testing.F) {
	for _, src := range documentSources(f) {
		f.Add(src)
		if doc, err := Parse(src); err == nil {
			if enc, err := EncodeDocument(doc); err == nil {
				f.Add(enc)
			}
		}
	}
	for _, s := range []string{"{}", `{"rules":null}`, `{"rules":[{}]}`, `{"keys":{"k":{"tier":"t"}},"rules":[{"id":"a","overrides":{"k":{"limit":-1}}}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// roundTrip encodes doc (a document decoded or parsed from data,
		// as from says) and decodes it back: both must succeed.
		roundTrip := func(doc *Document, from string) (enc []byte, back *Document) {
			t.Helper()
			enc, err := EncodeDocument(doc)
			if err != nil {
				t.Fatalf("a %s document does not encode: %v", from, err)
			}
			back, err = DecodeDocument(enc, data)
			if err != nil {
				t.Fatalf("%s, encoded from a %s document, does not decode: %v", enc, from, err)
			}
			return enc, back
		}
		if doc, err := DecodeDocument(data, data); err == nil {
			_, _ = Compile(doc)
			enc, back := roundTrip(doc, "decoded")
			if again, _ := EncodeDocument(back); !bytes.Equal(again, enc) {
				t.Fatalf("encoding unstable: %s, then %s", enc, again)
			}
		}
		doc, err := Parse(data)
		if err != nil {
			return
		}
		want, wantErr := Compile(doc)
		_, back := roundTrip(doc, "parsed")
		got, gotErr := Compile(back)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("the source compiles: %v; its document: %v", wantErr, gotErr)
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("the document of %q compiles to another ruleset than the source", data)
		}
	})
}
