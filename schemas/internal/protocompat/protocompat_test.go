package protocompat

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// baseFile is the released version every case changes:
//
//	syntax = "proto3";
//	package test.v1;
//	message Event {
//	  message Inner { int32 x = 1; }
//	  string name = 1;
//	  int64 count = 2;
//	  repeated string tags = 3;
//	  Kind kind = 4;
//	  Inner inner = 5;
//	  oneof target { string user = 6; string group = 7; }
//	  reserved 9, 20 to 29;
//	  reserved "old";
//	}
//	enum Kind {
//	  KIND_UNSPECIFIED = 0; KIND_A = 1; KIND_B = 2;
//	  reserved 5; reserved "KIND_OLD";
//	}
//	message Other { string id = 1; }
func baseFile() *descriptorpb.FileDescriptorProto {
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
		}
	}
	tags := field("tags", 3, descriptorpb.FieldDescriptorProto_TYPE_STRING)
	tags.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	kind := field("kind", 4, descriptorpb.FieldDescriptorProto_TYPE_ENUM)
	kind.TypeName = proto.String(".test.v1.Kind")
	inner := field("inner", 5, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE)
	inner.TypeName = proto.String(".test.v1.Event.Inner")
	user := field("user", 6, descriptorpb.FieldDescriptorProto_TYPE_STRING)
	user.OneofIndex = proto.Int32(0)
	group := field("group", 7, descriptorpb.FieldDescriptorProto_TYPE_STRING)
	group.OneofIndex = proto.Int32(0)
	value := func(name string, num int32) *descriptorpb.EnumValueDescriptorProto {
		return &descriptorpb.EnumValueDescriptorProto{Name: proto.String(name), Number: proto.Int32(num)}
	}
	return &descriptorpb.FileDescriptorProto{
		Name:    proto.String("test/v1/event.proto"),
		Package: proto.String("test.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Event"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("name", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING),
				field("count", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64),
				tags, kind, inner, user, group,
			},
			NestedType: []*descriptorpb.DescriptorProto{{
				Name:  proto.String("Inner"),
				Field: []*descriptorpb.FieldDescriptorProto{field("x", 1, descriptorpb.FieldDescriptorProto_TYPE_INT32)},
			}},
			OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("target")}},
			ReservedRange: []*descriptorpb.DescriptorProto_ReservedRange{
				{Start: proto.Int32(9), End: proto.Int32(10)},  // end exclusive
				{Start: proto.Int32(20), End: proto.Int32(30)}, // 20 to 29
			},
			ReservedName: []string{"old"},
		}, {
			Name:  proto.String("Other"),
			Field: []*descriptorpb.FieldDescriptorProto{field("id", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		}},
		EnumType: []*descriptorpb.EnumDescriptorProto{{
			Name:  proto.String("Kind"),
			Value: []*descriptorpb.EnumValueDescriptorProto{value("KIND_UNSPECIFIED", 0), value("KIND_A", 1), value("KIND_B", 2)},
			ReservedRange: []*descriptorpb.EnumDescriptorProto_EnumReservedRange{
				{Start: proto.Int32(5), End: proto.Int32(5)}, // end inclusive
			},
			ReservedName: []string{"KIND_OLD"},
		}},
	}
}

// Helpers that find parts of the file by name, for the cases to edit.
func message(f *descriptorpb.FileDescriptorProto, name string) *descriptorpb.DescriptorProto {
	for _, m := range f.MessageType {
		if m.GetName() == name {
			return m
		}
	}
	panic("no message " + name)
}

func fieldOf(m *descriptorpb.DescriptorProto, name string) *descriptorpb.FieldDescriptorProto {
	for _, f := range m.Field {
		if f.GetName() == name {
			return f
		}
	}
	panic("no field " + name)
}

func removeField(m *descriptorpb.DescriptorProto, name string) {
	for i, f := range m.Field {
		if f.GetName() == name {
			m.Field = append(m.Field[:i], m.Field[i+1:]...)
			return
		}
	}
	panic("no field " + name)
}

func enumValues(f *descriptorpb.FileDescriptorProto) *[]*descriptorpb.EnumValueDescriptorProto {
	return &f.EnumType[0].Value
}

func reserveField(m *descriptorpb.DescriptorProto, num int32) {
	m.ReservedRange = append(m.ReservedRange, &descriptorpb.DescriptorProto_ReservedRange{Start: proto.Int32(num), End: proto.Int32(num + 1)})
}

func registry(t *testing.T, f *descriptorpb.FileDescriptorProto) *protoregistry.Files {
	t.Helper()
	files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{f}})
	if err != nil {
		t.Fatalf("building the test descriptors: %v", err)
	}
	return files
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(f *descriptorpb.FileDescriptorProto)
		want   []string // one substring per expected problem, in Check's order
	}{
		{name: "unchanged", change: func(*descriptorpb.FileDescriptorProto) {}},
		{name: "field added", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{Name: proto.String("extra"), Number: proto.Int32(8),
				Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()})
		}},
		{name: "message, enum value and reservation added", change: func(f *descriptorpb.FileDescriptorProto) {
			f.MessageType = append(f.MessageType, &descriptorpb.DescriptorProto{Name: proto.String("New")})
			*enumValues(f) = append(*enumValues(f), &descriptorpb.EnumValueDescriptorProto{Name: proto.String("KIND_C"), Number: proto.Int32(3)})
			reserveField(message(f, "Event"), 100)
		}},
		{name: "field removed with number and name reserved", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			removeField(m, "count")
			reserveField(m, 2)
			m.ReservedName = append(m.ReservedName, "count")
		}},
		{name: "field renumbered", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "count").Number = proto.Int32(8)
		}, want: []string{
			`field "count" renumbered from 2 to 8`,
			`field 2 "count" removed without reserving its number and name`,
		}},
		{name: "field retyped", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "count").Type = descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
		}, want: []string{`field 2 "count" retyped from int64 to string`}},
		{name: "field retyped to a compatible-looking integer", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "count").Type = descriptorpb.FieldDescriptorProto_TYPE_UINT64.Enum()
		}, want: []string{`field 2 "count" retyped from int64 to uint64`}},
		{name: "field's message type changed", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "inner").TypeName = proto.String(".test.v1.Other")
		}, want: []string{`field 5 "inner" retyped from message test.v1.Event.Inner to message test.v1.Other`}},
		{name: "nested message's field retyped", change: func(f *descriptorpb.FileDescriptorProto) {
			message(f, "Event").NestedType[0].Field[0].Type = descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum()
		}, want: []string{`test.v1.Event.Inner: field 1 "x" retyped from int32 to int64`}},
		{name: "field made repeated", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "name").Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		}, want: []string{`field 1 "name" cardinality changed from optional to repeated`}},
		{name: "field moved out of its oneof", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "user").OneofIndex = nil
		}, want: []string{`field 6 "user" moved from oneof "target" to oneof ""`}},
		{name: "field removed without reserving", change: func(f *descriptorpb.FileDescriptorProto) {
			removeField(message(f, "Event"), "count")
		}, want: []string{`field 2 "count" removed without reserving its number and name`}},
		{name: "field removed, only its number reserved", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			removeField(m, "count")
			reserveField(m, 2)
		}, want: []string{`field 2 "count" removed: its number is reserved but not its name`}},
		{name: "field removed, only its name reserved", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			removeField(m, "count")
			m.ReservedName = append(m.ReservedName, "count")
		}, want: []string{`field 2 "count" removed: its name is reserved but not its number`}},
		{name: "field number reused by a new field", change: func(f *descriptorpb.FileDescriptorProto) {
			fieldOf(message(f, "Event"), "count").Name = proto.String("total")
		}, want: []string{`field 2 renamed from "count" to "total"`}},
		{name: "reserved number reused", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			m.ReservedRange = m.ReservedRange[1:] // drop "reserved 9"
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{Name: proto.String("fresh"), Number: proto.Int32(9),
				Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()})
		}, want: []string{
			`field 9 "fresh" reuses a reserved number`,
			`reserved field numbers 9 no longer all reserved`,
		}},
		{name: "part of a reserved range released", change: func(f *descriptorpb.FileDescriptorProto) {
			message(f, "Event").ReservedRange[1].End = proto.Int32(25)
		}, want: []string{`reserved field numbers 20 to 29 no longer all reserved`}},
		{name: "reserved range split but still covered", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			m.ReservedRange[1].End = proto.Int32(25)
			m.ReservedRange = append(m.ReservedRange, &descriptorpb.DescriptorProto_ReservedRange{Start: proto.Int32(25), End: proto.Int32(40)})
		}},
		{name: "reserved name reused", change: func(f *descriptorpb.FileDescriptorProto) {
			m := message(f, "Event")
			m.ReservedName = nil
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{Name: proto.String("old"), Number: proto.Int32(8),
				Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()})
		}, want: []string{
			`field 8 "old" reuses a reserved name`,
			`reserved field name "old" no longer reserved`,
		}},
		{name: "message removed", change: func(f *descriptorpb.FileDescriptorProto) {
			f.MessageType = f.MessageType[:1]
		}, want: []string{`test.v1.Other: message removed or renamed`}},
		{name: "package renamed", change: func(f *descriptorpb.FileDescriptorProto) {
			f.Package = proto.String("test.v2")
			fieldOf(message(f, "Event"), "kind").TypeName = proto.String(".test.v2.Kind")
			fieldOf(message(f, "Event"), "inner").TypeName = proto.String(".test.v2.Event.Inner")
		}, want: []string{
			`test.v1.Event: message removed`, `test.v1.Event.Inner: message removed`,
			`test.v1.Kind: enum removed`, `test.v1.Other: message removed`,
		}},
		{name: "enum value removed without reserving", change: func(f *descriptorpb.FileDescriptorProto) {
			*enumValues(f) = (*enumValues(f))[:2]
		}, want: []string{`value 2 KIND_B removed without reserving its number and name`}},
		{name: "enum value removed with number and name reserved", change: func(f *descriptorpb.FileDescriptorProto) {
			*enumValues(f) = (*enumValues(f))[:2]
			e := f.EnumType[0]
			e.ReservedRange = append(e.ReservedRange, &descriptorpb.EnumDescriptorProto_EnumReservedRange{Start: proto.Int32(2), End: proto.Int32(2)})
			e.ReservedName = append(e.ReservedName, "KIND_B")
		}},
		{name: "enum value renumbered", change: func(f *descriptorpb.FileDescriptorProto) {
			(*enumValues(f))[2].Number = proto.Int32(3)
		}, want: []string{
			`value 2 KIND_B removed without reserving`,
			`value KIND_B renumbered from 2 to 3`,
		}},
		{name: "enum value renamed", change: func(f *descriptorpb.FileDescriptorProto) {
			(*enumValues(f))[2].Name = proto.String("KIND_C")
		}, want: []string{`value 2 renamed from KIND_B to KIND_C`}},
		{name: "reserved enum value reused", change: func(f *descriptorpb.FileDescriptorProto) {
			e := f.EnumType[0]
			e.ReservedRange, e.ReservedName = nil, nil
			e.Value = append(e.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String("KIND_OLD"), Number: proto.Int32(5)})
		}, want: []string{
			`reserved value name "KIND_OLD" no longer reserved`,
			`reserved value numbers 5 no longer all reserved`,
			`value 5 KIND_OLD reuses a reserved name`,
			`value 5 KIND_OLD reuses a reserved number`,
		}},
		{name: "enum removed", change: func(f *descriptorpb.FileDescriptorProto) {
			f.EnumType = nil
			fieldOf(message(f, "Event"), "kind").Type = descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum()
			fieldOf(message(f, "Event"), "kind").TypeName = nil
		}, want: []string{
			`test.v1.Event: field 4 "kind" retyped from enum test.v1.Kind to int32`,
			`test.v1.Kind: enum removed or renamed`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cur := proto.CloneOf(baseFile())
			tt.change(cur)
			got := Check(registry(t, baseFile()), registry(t, cur))
			if len(got) != len(tt.want) {
				t.Fatalf("Check found %d problems, want %d:\n%s", len(got), len(tt.want), lines(got))
			}
			for i, p := range got {
				if !strings.Contains(p.String(), tt.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tt.want[i])
				}
			}
		})
	}
}

func lines(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("\t" + p.String() + "\n")
	}
	return b.String()
}

func TestCovered(t *testing.T) {
	t.Parallel()
	spans := []span{{20, 24}, {1, 1}, {25, 30}, {40, 50}}
	tests := []struct {
		lo, hi int64
		want   bool
	}{
		{1, 1, true}, {2, 2, false}, {20, 30, true}, {22, 27, true},
		{20, 31, false}, {30, 40, false}, {45, 50, true}, {0, 1, false},
	}
	for _, tt := range tests {
		if got := covered(spans, tt.lo, tt.hi); got != tt.want {
			t.Errorf("covered(%v, %d, %d) = %v, want %v", spans, tt.lo, tt.hi, got, tt.want)
		}
	}
}
