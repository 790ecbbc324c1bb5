// Package configs holds Tollgate's embedded example configuration and the
// one loader every process uses: a YAML file decoded strictly (unknown
// fields are refused, naming the line), then every field overridable by an
// environment variable named TOLLGATE_ + the field's YAML path in upper
// snake case (`redis.addrs` → TOLLGATE_REDIS_ADDRS). The variables are
// derived by reflection over the struct's yaml tags, so a new field gets its
// variable, its --help line and its error messages without anything to keep
// in sync.
//
// A configuration is a plain struct. Fields are documented for --help with
// a `doc:"..."` tag (or, for structs the process does not own, an entry in
// the docs table passed to [Vars]); `env:"-"` keeps a field out of the
// environment. Supported field types: string, bool, signed and unsigned
// integers, floats, time.Duration (Go syntax: 50ms, 10s, 1h), types
// implementing encoding.TextUnmarshaler, slices of those (comma-separated in
// the environment), and nested structs (a path segment each; `,inline`
// structs add none).
//
// Defaults are not the loader's business: a process's Config has a
// SetDefaults method filling zero fields, applied after [Load], and the
// embedded example file ([GatewayYAML]) states those defaults, which the
// gateway's tests check.
//
// The binaries share their start too: [Main] refuses an unknown TOLLGATE_*
// variable before anything runs, [ParseArgs] answers bad flags and --help,
// and [WriteUsage] writes the --help text with every variable.
package configs

import (
	"bytes"
	"cmp"
	_ "embed"
	"encoding"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Prefix starts every environment variable of a Tollgate process.
const Prefix = "TOLLGATE_"

//go:embed gateway.yaml
var gatewayYAML []byte

// GatewayYAML returns the documented example gateway configuration: every
// field with its default and what it does. The caller owns the returned
// slice.
func GatewayYAML() []byte { return bytes.Clone(gatewayYAML) }

// LookupFunc looks an environment variable up, as os.LookupEnv does.
type LookupFunc func(name string) (value string, ok bool)

// MapLookup looks variables up in m instead of the process's environment
// (an embedding program's settings, a test's).
func MapLookup(m map[string]string) LookupFunc {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Var describes one configuration field and its environment variable.
type Var struct {
	// Name is the environment variable, e.g. TOLLGATE_REDIS_ADDRS.
	Name string
	// Path is the field's YAML path, e.g. redis.addrs.
	Path string
	// Kind is a short name of the value's syntax: string, bool, int,
	// float, duration, list.
	Kind string
	// Default is the field's value in the struct given to Vars (the
	// defaults, when SetDefaults was applied), as it would be written in
	// the environment; "" when empty.
	Default string
	// Doc is the field's `doc` tag, else its entry in the docs table.
	Doc string
}

// Load fills cfg, a pointer to a struct, from the YAML file at path (none
// when path is empty) and then from the environment (lookup; nil means
// os.LookupEnv). Fields neither names keep their value in cfg. Errors name
// the file and line, or the variable; every bad variable is reported, not
// only the first.
func Load(cfg any, path string, lookup LookupFunc) error {
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("configs: %w", err)
		}
		if err := Decode(cfg, data, path); err != nil {
			return err
		}
	}
	return ApplyEnv(cfg, lookup)
}

// Decode decodes one YAML document into cfg (a pointer to a struct),
// refusing fields cfg does not have. An empty document changes nothing.
// name (a file name) prefixes errors, which carry yaml's line numbers.
func Decode(cfg any, data []byte, name string) error {
	if err := checkTarget(cfg); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("configs: %s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return fmt.Errorf("configs: %s: %w", name, err)
		}
		return fmt.Errorf("configs: %s: line %d: more than one YAML document", name, extra.Line)
	}
	return nil
}

// ApplyEnv sets every field of cfg (a pointer to a struct) whose variable
// is set in the environment (lookup; nil means os.LookupEnv). A variable set
// to the empty string sets the field's zero value (SetDefaults then applies
// the default where zero means "default"). Every bad value is reported,
// each naming its variable and field; on error cfg may be partly updated.
func ApplyEnv(cfg any, lookup LookupFunc) error {
	if err := checkTarget(cfg); err != nil {
		return err
	}
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var errs []error
	err := walk(reflect.ValueOf(cfg).Elem(), "", func(f *field) error {
		raw, ok := lookup(f.name)
		if !ok {
			return nil
		}
		if err := setValue(f.v, raw); err != nil {
			errs = append(errs, fmt.Errorf("configs: %s (%s): %s", f.name, f.path, err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// Vars lists cfg's fields (cfg is a struct or a pointer to one) in
// declaration order, with their current values as defaults: pass a config
// with its defaults applied. docs supplies the documentation of fields
// without a `doc` tag, by YAML path. It fails when a field's type cannot be
// set from the environment, two fields map to the same variable, or docs
// names a path that is not a field (a stale entry).
func Vars(cfg any, docs map[string]string) ([]Var, error) {
	v := reflect.ValueOf(cfg)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil, fmt.Errorf("configs: Vars of %T: not a struct", cfg)
	}
	var vars []Var
	seen := map[string]string{}
	used := map[string]bool{}
	err := walk(v, "", func(f *field) error {
		if other, dup := seen[f.name]; dup {
			return fmt.Errorf("configs: fields %s and %s both map to %s", other, f.path, f.name)
		}
		seen[f.name] = f.path
		doc := f.doc
		if doc == "" {
			doc = docs[f.path]
			used[f.path] = docs[f.path] != ""
		}
		vars = append(vars, Var{Name: f.name, Path: f.path, Kind: kindOf(f.v.Type()), Default: format(f.v), Doc: doc})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, p := range slices.Sorted(maps.Keys(docs)) {
		if _, ok := used[p]; !ok {
			return nil, fmt.Errorf("configs: docs entry %q names no field of %s", p, v.Type())
		}
	}
	return vars, nil
}

// WriteHelp writes one entry per variable: its name, field, default and
// documentation, wrapped for a terminal.
func WriteHelp(w io.Writer, vars []Var) error {
	var b strings.Builder
	for _, v := range vars {
		def := cmp.Or(v.Default, "none")
		fmt.Fprintf(&b, "  %s  (%s, %s; default: %s)\n", v.Name, v.Path, v.Kind, def)
		for _, line := range wrap(v.Doc, 72) {
			b.WriteString("      ")
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap splits text into lines of at most width bytes at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// EnvName returns the variable of a YAML path: Prefix + the path in upper
// snake case ("redis.addrs" → "TOLLGATE_REDIS_ADDRS").
func EnvName(path string) string {
	r := strings.NewReplacer(".", "_", "-", "_")
	return Prefix + strings.ToUpper(r.Replace(path))
}

func checkTarget(cfg any) error {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("configs: want a non-nil pointer to a struct, got %T", cfg)
	}
	return nil
}

// field is one settable leaf of a configuration struct.
type field struct {
	path, name, doc string
	v               reflect.Value
}

var (
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	textMarshaler   = reflect.TypeFor[encoding.TextMarshaler]()
	durationType    = reflect.TypeFor[time.Duration]()
)

// walk calls fn for every leaf field of the struct v, depth first in
// declaration order.
func walk(v reflect.Value, prefix string, fn func(*field) error) error {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || sf.Tag.Get("env") == "-" {
			continue
		}
		fv := v.Field(i)
		if slices.Contains(strings.Split(opts, ","), "inline") {
			if fv.Kind() != reflect.Struct {
				return fmt.Errorf("configs: %s.%s: only structs can be inlined", t, sf.Name)
			}
			if err := walk(fv, prefix, fn); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name) // yaml's own default
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if fv.Kind() == reflect.Struct && !isText(fv.Type()) {
			if err := walk(fv, path, fn); err != nil {
				return err
			}
			continue
		}
		if !settable(fv.Type()) {
			return fmt.Errorf("configs: field %s (%s): type %s cannot be set from the environment (tag it env:\"-\")", path, sf.Name, fv.Type())
		}
		if err := fn(&field{path: path, name: EnvName(path), doc: sf.Tag.Get("doc"), v: fv}); err != nil {
			return err
		}
	}
	return nil
}

func isText(t reflect.Type) bool { return reflect.PointerTo(t).Implements(textUnmarshaler) }

// settable reports whether a value of type t can be parsed from a variable.
func settable(t reflect.Type) bool {
	if isText(t) {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	case reflect.Slice:
		e := t.Elem()
		return e.Kind() != reflect.Slice && settable(e)
	}
	return false
}

func kindOf(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case isText(t):
		return "string"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Slice:
		return "list"
	}
	return "string"
}

// setValue parses raw into v.
func setValue(v reflect.Value, raw string) error {
	t := v.Type()
	if isText(t) {
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(raw)); err != nil {
			return fmt.Errorf("invalid value %s: %v", quote(raw), err)
		}
		return nil
	}
	if raw == "" && t.Kind() != reflect.String {
		v.SetZero()
		return nil
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("%s is not a boolean (true or false)", quote(raw))
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		s := strings.TrimSpace(raw)
		if t == durationType {
			d, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("%s is not a duration (Go syntax, like 50ms, 10s or 1h30m)", quote(raw))
			}
			v.SetInt(int64(d))
			return nil
		}
		n, err := strconv.ParseInt(s, 10, t.Bits())
		if err != nil {
			return fmt.Errorf("%s is not an integer of %d bits", quote(raw), t.Bits())
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(strings.TrimSpace(raw), 10, t.Bits())
		if err != nil {
			return fmt.Errorf("%s is not a non-negative integer of %d bits", quote(raw), t.Bits())
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(raw), t.Bits())
		if err != nil {
			return fmt.Errorf("%s is not a number", quote(raw))
		}
		v.SetFloat(f)
	case reflect.Slice:
		parts := strings.Split(raw, ",")
		s := reflect.MakeSlice(t, 0, len(parts))
		for i, p := range parts {
			p = strings.TrimSpace(p)
			if p == "" {
				continue // "a,,b" and a trailing comma
			}
			e := reflect.New(t.Elem()).Elem()
			if err := setValue(e, p); err != nil {
				return fmt.Errorf("item %d: %w", i+1, err)
			}
			s = reflect.Append(s, e)
		}
		v.Set(s)
	default:
		return fmt.Errorf("type %s cannot be set from the environment", t)
	}
	return nil
}

// quote quotes a bad value for an error message, shortened: a long value is
// more likely a secret pasted into the wrong variable than a typo.
func quote(s string) string {
	const maxShown = 40
	if len(s) > maxShown {
		return strconv.Quote(s[:maxShown]) + "…"
	}
	return strconv.Quote(s)
}

// format renders v as a variable's value, for defaults in --help.
func format(v reflect.Value) string {
	t := v.Type()
	if t.Implements(textMarshaler) {
		b, err := v.Interface().(encoding.TextMarshaler).MarshalText()
		if err == nil {
			return string(b)
		}
	}
	switch {
	case t == durationType:
		return time.Duration(v.Int()).String()
	case t.Kind() == reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = format(v.Index(i))
		}
		return strings.Join(parts, ",")
	case t.Kind() == reflect.String:
		return v.String()
	case t.Kind() == reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, t.Bits())
	case v.CanInt():
		return strconv.FormatInt(v.Int(), 10)
	case v.CanUint():
		return strconv.FormatUint(v.Uint(), 10)
	}
	return fmt.Sprint(v.Interface())
}
