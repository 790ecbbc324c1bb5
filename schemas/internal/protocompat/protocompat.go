// Package protocompat finds the changes between a released version of a set
// of Protocol Buffers files and the current one that would break a reader or
// writer of the released version: the check behind the rule in
// schemas/README.md (add fields; never renumber, retype or reuse; reserve what
// you remove).
//
// Check compares every message and enum of the released files with the
// current descriptor of the same full name:
//
//   - a message or enum that is gone;
//   - a field (by number) whose name, type, cardinality or oneof changed;
//   - a field that is gone without both its number and its name reserved;
//   - an enum value (by number) whose name changed, or that is gone without
//     both its number and its name reserved;
//   - a reserved number or name that is no longer reserved, or that a field
//     or value now uses.
//
// Additions (messages, enums, fields, values, reservations) are never a
// problem. The package is pure: it reads descriptors and returns problems.
package protocompat

import (
	"cmp"
	"fmt"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Problem is one breaking change.
type Problem struct {
	// Element is the full name of the message or enum that changed.
	Element protoreflect.FullName
	// Msg says what changed, naming the field or value and its number.
	Msg string
}

func (p Problem) String() string { return string(p.Element) + ": " + p.Msg }

// Check returns every breaking change from released to current, sorted by
// element and message; none when current only adds to released. Descriptors
// of current that released does not name are not looked at, so current may be
// a registry holding other files too (protoregistry.GlobalFiles).
func Check(released, current *protoregistry.Files) []Problem {
	var out []Problem
	report := func(el protoreflect.FullName, format string, args ...any) {
		out = append(out, Problem{Element: el, Msg: fmt.Sprintf(format, args...)})
	}
	released.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		walk(f.Messages(), f.Enums(), func(m protoreflect.MessageDescriptor) {
			d, err := current.FindDescriptorByName(m.FullName())
			cm, ok := d.(protoreflect.MessageDescriptor)
			if err != nil || !ok {
				report(m.FullName(), "message removed or renamed")
				return
			}
			checkMessage(m, cm, report)
		}, func(e protoreflect.EnumDescriptor) {
			d, err := current.FindDescriptorByName(e.FullName())
			ce, ok := d.(protoreflect.EnumDescriptor)
			if err != nil || !ok {
				report(e.FullName(), "enum removed or renamed")
				return
			}
			checkEnum(e, ce, report)
		})
		return true
	})
	slices.SortFunc(out, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Element, b.Element), cmp.Compare(a.Msg, b.Msg))
	})
	return out
}

// walk calls onMsg for every message (nested ones included, map entries too)
// and onEnum for every enum.
func walk(msgs protoreflect.MessageDescriptors, enums protoreflect.EnumDescriptors,
	onMsg func(protoreflect.MessageDescriptor), onEnum func(protoreflect.EnumDescriptor)) {
	for i := range enums.Len() {
		onEnum(enums.Get(i))
	}
	for i := range msgs.Len() {
		m := msgs.Get(i)
		onMsg(m)
		walk(m.Messages(), m.Enums(), onMsg, onEnum)
	}
}

type reportFunc func(el protoreflect.FullName, format string, args ...any)

func checkMessage(old, cur protoreflect.MessageDescriptor, report reportFunc) {
	el := old.FullName()
	oldFields, curFields := old.Fields(), cur.Fields()
	for i := range oldFields.Len() {
		f := oldFields.Get(i)
		cf := curFields.ByNumber(f.Number())
		if cf == nil {
			numRes := cur.ReservedRanges().Has(f.Number())
			nameRes := cur.ReservedNames().Has(f.Name())
			switch {
			case numRes && nameRes:
				// Removed the right way.
			case numRes:
				report(el, "field %d %q removed: its number is reserved but not its name", f.Number(), f.Name())
			case nameRes:
				report(el, "field %d %q removed: its name is reserved but not its number", f.Number(), f.Name())
			default:
				report(el, "field %d %q removed without reserving its number and name", f.Number(), f.Name())
			}
			if moved := curFields.ByName(f.Name()); moved != nil {
				report(el, "field %q renumbered from %d to %d", f.Name(), f.Number(), moved.Number())
			}
			continue
		}
		if cf.Name() != f.Name() {
			report(el, "field %d renamed from %q to %q", f.Number(), f.Name(), cf.Name())
		}
		if a, b := fieldType(f), fieldType(cf); a != b {
			report(el, "field %d %q retyped from %s to %s", f.Number(), f.Name(), a, b)
		}
		if f.Cardinality() != cf.Cardinality() {
			report(el, "field %d %q cardinality changed from %s to %s", f.Number(), f.Name(), f.Cardinality(), cf.Cardinality())
		}
		if a, b := oneofName(f), oneofName(cf); a != b {
			report(el, "field %d %q moved from oneof %q to oneof %q", f.Number(), f.Name(), a, b)
		}
	}
	checkReserved(el, "field", fieldRanges(old.ReservedRanges()), fieldRanges(cur.ReservedRanges()),
		old.ReservedNames(), cur.ReservedNames(), report)
	for i := range curFields.Len() {
		cf := curFields.Get(i)
		if n := int64(cf.Number()); covered(fieldRanges(old.ReservedRanges()), n, n) {
			report(el, "field %d %q reuses a reserved number", cf.Number(), cf.Name())
		}
		if old.ReservedNames().Has(cf.Name()) {
			report(el, "field %d %q reuses a reserved name", cf.Number(), cf.Name())
		}
	}
}

func checkEnum(old, cur protoreflect.EnumDescriptor, report reportFunc) {
	el := old.FullName()
	oldValues, curValues := old.Values(), cur.Values()
	for i := range oldValues.Len() {
		v := oldValues.Get(i)
		cv := curValues.ByNumber(v.Number())
		if cv == nil {
			numRes := cur.ReservedRanges().Has(v.Number())
			nameRes := cur.ReservedNames().Has(v.Name())
			switch {
			case numRes && nameRes:
			case numRes:
				report(el, "value %d %s removed: its number is reserved but not its name", v.Number(), v.Name())
			case nameRes:
				report(el, "value %d %s removed: its name is reserved but not its number", v.Number(), v.Name())
			default:
				report(el, "value %d %s removed without reserving its number and name", v.Number(), v.Name())
			}
			if moved := curValues.ByName(v.Name()); moved != nil {
				report(el, "value %s renumbered from %d to %d", v.Name(), v.Number(), moved.Number())
			}
			continue
		}
		if cv.Name() != v.Name() {
			report(el, "value %d renamed from %s to %s", v.Number(), v.Name(), cv.Name())
		}
	}
	checkReserved(el, "value", enumRanges(old.ReservedRanges()), enumRanges(cur.ReservedRanges()),
		old.ReservedNames(), cur.ReservedNames(), report)
	for i := range curValues.Len() {
		cv := curValues.Get(i)
		if n := int64(cv.Number()); covered(enumRanges(old.ReservedRanges()), n, n) {
			report(el, "value %d %s reuses a reserved number", cv.Number(), cv.Name())
		}
		if old.ReservedNames().Has(cv.Name()) {
			report(el, "value %d %s reuses a reserved name", cv.Number(), cv.Name())
		}
	}
}

// checkReserved reports reservations of old that cur no longer has.
func checkReserved(el protoreflect.FullName, what string, oldRanges, curRanges []span,
	oldNames, curNames protoreflect.Names, report reportFunc) {
	for _, r := range oldRanges {
		if !covered(curRanges, r.lo, r.hi) {
			report(el, "reserved %s numbers %s no longer all reserved", what, r)
		}
	}
	for i := range oldNames.Len() {
		if n := oldNames.Get(i); !curNames.Has(n) {
			report(el, "reserved %s name %q no longer reserved", what, n)
		}
	}
}

// fieldType names a field's wire type: its kind, and for a message or enum
// its full name.
func fieldType(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return f.Kind().String() + " " + string(f.Message().FullName())
	case protoreflect.EnumKind:
		return "enum " + string(f.Enum().FullName())
	}
	return f.Kind().String()
}

// oneofName is the name of the real oneof holding f; "" for none (a proto3
// optional field's synthetic oneof does not count: it changes no wire form).
func oneofName(f protoreflect.FieldDescriptor) protoreflect.Name {
	if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
		return o.Name()
	}
	return ""
}

// span is an inclusive range of field or enum numbers.
type span struct{ lo, hi int64 }

func (s span) String() string {
	if s.lo == s.hi {
		return fmt.Sprint(s.lo)
	}
	return fmt.Sprintf("%d to %d", s.lo, s.hi)
}

func fieldRanges(r protoreflect.FieldRanges) []span {
	out := make([]span, r.Len())
	for i := range out {
		x := r.Get(i) // [start, end)
		out[i] = span{int64(x[0]), int64(x[1]) - 1}
	}
	return out
}

func enumRanges(r protoreflect.EnumRanges) []span {
	out := make([]span, r.Len())
	for i := range out {
		x := r.Get(i) // [start, end]
		out[i] = span{int64(x[0]), int64(x[1])}
	}
	return out
}

// covered reports whether the union of spans covers every number in
// [lo, hi].
func covered(spans []span, lo, hi int64) bool {
	sorted := slices.SortedFunc(slices.Values(spans), func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	next := lo // the first number not yet known to be covered
	for _, s := range sorted {
		if s.lo > next {
			break
		}
		next = max(next, s.hi+1)
		if next > hi {
			return true
		}
	}
	return false
}
