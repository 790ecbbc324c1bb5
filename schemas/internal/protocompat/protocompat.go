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
			checkCounterpart(current, m, "message", report, checkMessage)
		}, func(e protoreflect.EnumDescriptor) {
			checkCounterpart(current, e, "enum", report, checkEnum)
		})
		return true
	})
	slices.SortFunc(out, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Element, b.Element), cmp.Compare(a.Msg, b.Msg))
	})
	return out
}

// checkCounterpart checks old against the descriptor of its name in
// current with check; none, or one of another kind, is reported as old
// (a what: "message" or "enum") removed or renamed.
func checkCounterpart[D protoreflect.Descriptor](current *protoregistry.Files, old D, what string,
	report reportFunc, check func(old, cur D, report reportFunc)) {
	d, err := current.FindDescriptorByName(old.FullName())
	cur, ok := d.(D)
	if err != nil || !ok {
		report(old.FullName(), what+" removed or renamed")
		return
	}
	check(old, cur, report)
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
	type fields = numbering[protoreflect.FieldNumber, protoreflect.FieldDescriptor]
	el := old.FullName()
	checkNumbering(el, "field", "%q",
		fields{old.Fields(), fieldRanges(old.ReservedRanges()), old.ReservedNames()},
		fields{cur.Fields(), fieldRanges(cur.ReservedRanges()), cur.ReservedNames()},
		report, func(f, cf protoreflect.FieldDescriptor) {
			if a, b := fieldType(f), fieldType(cf); a != b {
				report(el, "field %d %q retyped from %s to %s", f.Number(), f.Name(), a, b)
			}
			if f.Cardinality() != cf.Cardinality() {
				report(el, "field %d %q cardinality changed from %s to %s", f.Number(), f.Name(), f.Cardinality(), cf.Cardinality())
			}
			if a, b := oneofName(f), oneofName(cf); a != b {
				report(el, "field %d %q moved from oneof %q to oneof %q", f.Number(), f.Name(), a, b)
			}
		})
}

func checkEnum(old, cur protoreflect.EnumDescriptor, report reportFunc) {
	type values = numbering[protoreflect.EnumNumber, protoreflect.EnumValueDescriptor]
	checkNumbering(old.FullName(), "value", "%s",
		values{old.Values(), enumRanges(old.ReservedRanges()), old.ReservedNames()},
		values{cur.Values(), enumRanges(cur.ReservedRanges()), cur.ReservedNames()},
		report, func(protoreflect.EnumValueDescriptor, protoreflect.EnumValueDescriptor) {})
}

// numbered is a message's field or an enum's value.
type numbered[N ~int32] interface {
	Number() N
	Name() protoreflect.Name
}

// numbering is a message's fields or an enum's values, with the numbers
// (ranges) and names it reserves.
type numbering[N ~int32, D numbered[N]] struct {
	list interface {
		Len() int
		Get(i int) D
		ByNumber(n N) D
		ByName(s protoreflect.Name) D
	}
	ranges []span
	names  protoreflect.Names
}

// checkNumbering reports the changes of numbers and names from old to cur,
// naming a member what ("field" or "value") and formatting its name with
// nameVerb, and calls same with each old member and the member of cur
// with its number.
func checkNumbering[N ~int32, D numbered[N]](el protoreflect.FullName, what, nameVerb string,
	old, cur numbering[N, D], report reportFunc, same func(o, c D)) {
	name := func(d D) string { return fmt.Sprintf(nameVerb, d.Name()) }
	for i := range old.list.Len() {
		o := old.list.Get(i)
		c := cur.list.ByNumber(o.Number())
		if any(c) == nil {
			n := int64(o.Number())
			numRes, nameRes := covered(cur.ranges, n, n), cur.names.Has(o.Name())
			switch {
			case numRes && nameRes:
				// Removed the right way.
			case numRes:
				report(el, "%s %d %s removed: its number is reserved but not its name", what, n, name(o))
			case nameRes:
				report(el, "%s %d %s removed: its name is reserved but not its number", what, n, name(o))
			default:
				report(el, "%s %d %s removed without reserving its number and name", what, n, name(o))
			}
			if moved := cur.list.ByName(o.Name()); any(moved) != nil {
				report(el, "%s %s renumbered from %d to %d", what, name(o), n, moved.Number())
			}
			continue
		}
		if c.Name() != o.Name() {
			report(el, "%s %d renamed from %s to %s", what, o.Number(), name(o), name(c))
		}
		same(o, c)
	}
	checkReserved(el, what, old.ranges, cur.ranges, old.names, cur.names, report)
	for i := range cur.list.Len() {
		c := cur.list.Get(i)
		if n := int64(c.Number()); covered(old.ranges, n, n) {
			report(el, "%s %d %s reuses a reserved number", what, n, name(c))
		}
		if old.names.Has(c.Name()) {
			report(el, "%s %d %s reuses a reserved name", what, c.Number(), name(c))
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
