package tollgatev1_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/tollgate/tollgate/schemas/internal/protocompat"
	_ "github.com/tollgate/tollgate/schemas/tollgatev1" // registers the tollgate.v1 descriptors
)

var updateReleased = flag.Bool("update-released", false,
	"rewrite testdata/released.binpb, the breaking-change baseline, from the compiled-in descriptors "+
		"(when a compatible schema change is released; refused if the change breaks the old baseline)")

const (
	moduleRoot   = "../.." // the tests run in schemas/tollgatev1
	protoDir     = "schemas/proto"
	protoPackage = "tollgate.v1"
	releasedFile = "testdata/released.binpb"
	regenerate   = "run `make generate` and commit the result"
	installHint  = "protoc is missing: install it with `apt-get install -y protobuf-compiler` " +
		"(`make deps` does, as root), then run the tests again"
)

// protoFiles lists the .proto sources as make generate passes them: slash
// paths from the module root, sorted (protoc writes the descriptor set in
// argument order).
func protoFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(moduleRoot, protoDir, "tollgate", "v1", "*.proto"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .proto files under %s (%v)", protoDir, err)
	}
	for i, f := range files {
		rel, err := filepath.Rel(moduleRoot, f)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = filepath.ToSlash(rel)
	}
	slices.Sort(files)
	return files
}

// lookProtoc finds protoc, failing the test (not skipping it: a skipped
// staleness check passes CI while checking nothing) with the install command.
func lookProtoc(t *testing.T) string {
	t.Helper()
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Fatal(installHint)
	}
	return protoc
}

// run runs a command in the module root and fails the test with its output
// and hint if it fails.
func run(t *testing.T, hint, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = moduleRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s\n%s", name, strings.Join(args, " "), err, out, hint)
	}
}

// protocVersionLine is the header line that names protoc's version. It is
// the one difference allowed between the committed and the regenerated code,
// so a machine with another protoc than Debian's 3.21 can still check.
var protocVersionLine = regexp.MustCompile(`(?m)^// \tprotoc +v.*$`)

// TestGeneratedCodeIsFresh regenerates the Go code and the descriptor set
// into a temporary directory, exactly as make generate does, and compares
// them with the committed files. protoc-gen-go is built from the module cache
// at go.mod's version (no network); protoc must be installed.
func TestGeneratedCodeIsFresh(t *testing.T) {
	t.Parallel()
	protoc := lookProtoc(t)
	tmp := t.TempDir()
	plugin := filepath.Join(tmp, "protoc-gen-go")
	run(t, "building protoc-gen-go from the module cache failed; install it with "+
		"`GOBIN=$PWD/bin go install google.golang.org/protobuf/cmd/protoc-gen-go@<go.mod's version>`",
		"go", "build", "-o", plugin, "google.golang.org/protobuf/cmd/protoc-gen-go")

	out := filepath.Join(tmp, "out")
	if err := os.MkdirAll(filepath.Join(out, "schemas", "tollgatev1"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--plugin=protoc-gen-go=" + plugin, "-I", protoDir,
		"--go_out=" + out, "--go_opt=module=github.com/tollgate/tollgate",
		"--descriptor_set_out=" + filepath.Join(out, "schemas", "tollgatev1", "descriptors.binpb"),
	}, protoFiles(t)...)
	run(t, "", protoc, args...)

	fresh := filepath.Join(out, "schemas", "tollgatev1")
	want := generatedFiles(t, fresh)
	got := generatedFiles(t, ".")
	for _, name := range want {
		if !slices.Contains(got, name) {
			t.Errorf("%s is missing: %s", name, regenerate)
		}
	}
	for _, name := range got {
		if !slices.Contains(want, name) {
			t.Errorf("%s is not generated from any .proto (a removed source?): %s", name, regenerate)
			continue
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		regenerated, err := os.ReadFile(filepath.Join(fresh, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, ".go") {
			committed = protocVersionLine.ReplaceAll(committed, nil)
			regenerated = protocVersionLine.ReplaceAll(regenerated, nil)
		}
		if !bytes.Equal(committed, regenerated) {
			t.Errorf("%s is stale (%s): %s", name, firstDifference(name, committed, regenerated), regenerate)
		}
	}
}

// generatedFiles lists the generated files in dir: *.pb.go and
// descriptors.binpb.
func generatedFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	if _, err := os.Stat(filepath.Join(dir, "descriptors.binpb")); err == nil {
		names = append(names, "descriptors.binpb")
	}
	slices.Sort(names)
	return names
}

// firstDifference describes where two files first differ: by line for Go
// code, by byte offset for the binary descriptor set.
func firstDifference(name string, committed, regenerated []byte) string {
	if !strings.HasSuffix(name, ".go") {
		for i := range min(len(committed), len(regenerated)) {
			if committed[i] != regenerated[i] {
				return fmt.Sprintf("first difference at byte %d", i)
			}
		}
		return fmt.Sprintf("%d bytes committed, %d regenerated", len(committed), len(regenerated))
	}
	a, b := bytes.Split(committed, []byte("\n")), bytes.Split(regenerated, []byte("\n"))
	for i := range min(len(a), len(b)) {
		if !bytes.Equal(a[i], b[i]) {
			return fmt.Sprintf("line %d is %.80q, protoc now writes %.80q", i+1, a[i], b[i])
		}
	}
	return fmt.Sprintf("%d lines committed, %d regenerated", len(a), len(b))
}

// compiledSet is the descriptor set of the tollgate.v1 files compiled into
// the Go package, sorted by path.
func compiledSet(t *testing.T) *descriptorpb.FileDescriptorSet {
	t.Helper()
	set := &descriptorpb.FileDescriptorSet{}
	protoregistry.GlobalFiles.RangeFilesByPackage(protoPackage, func(fd protoreflect.FileDescriptor) bool {
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
		return true
	})
	if len(set.File) == 0 {
		t.Fatalf("no %s files registered", protoPackage)
	}
	slices.SortFunc(set.File, func(a, b *descriptorpb.FileDescriptorProto) int { return strings.Compare(a.GetName(), b.GetName()) })
	return set
}

// TestNoBreakingChanges compares the last released contract,
// testdata/released.binpb, with the descriptors compiled into the package:
// every message, field and enum value released must still be there with the
// same number, name, type and cardinality, or be reserved by number and name
// (schemas/README.md). The baseline is not descriptors.binpb, which make
// generate rewrites with every change; it moves only with -update-released.
func TestNoBreakingChanges(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(releasedFile)
	if os.IsNotExist(err) && *updateReleased {
		raw, err = nil, nil // first release: nothing to break
	}
	if err != nil {
		t.Fatalf("reading the released contract: %v (restore it from git; a new package starts its own with -update-released)", err)
	}
	released := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(raw, released); err != nil {
		t.Fatalf("%s: %v", releasedFile, err)
	}
	releasedFiles, err := protodesc.NewFiles(released)
	if err != nil {
		t.Fatalf("%s: %v", releasedFile, err)
	}
	problems := protocompat.Check(releasedFiles, protoregistry.GlobalFiles)
	for _, p := range problems {
		t.Errorf("breaking change: %s", p)
	}
	if len(problems) > 0 {
		t.Logf("these changes break readers of %s: add fields instead, reserve the number and name of a removed one, "+
			"or make a breaking change a new package tollgatev2 on new …v2 topics (schemas/README.md)", releasedFile)
		if *updateReleased {
			t.Fatalf("-update-released refused: the baseline only moves forward compatibly")
		}
		return
	}
	if !*updateReleased {
		return
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(compiledSet(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(releasedFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes): commit it on its own, saying which change it releases", releasedFile, len(b))
}

// TestEveryElementDocumented fails when a message, field, enum or enum value
// in the .proto files has no leading comment: the comments are the contract's
// only documentation for consumers in other languages.
func TestEveryElementDocumented(t *testing.T) {
	t.Parallel()
	protoc := lookProtoc(t)
	set := filepath.Join(t.TempDir(), "withsource.binpb")
	run(t, "", protoc, append([]string{"-I", protoDir, "--include_source_info", "--descriptor_set_out=" + set}, protoFiles(t)...)...)
	raw, err := os.ReadFile(set)
	if err != nil {
		t.Fatal(err)
	}
	fds := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(raw, fds); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(fds)
	if err != nil {
		t.Fatal(err)
	}
	var check func(d protoreflect.Descriptor)
	check = func(d protoreflect.Descriptor) {
		loc := d.ParentFile().SourceLocations().ByDescriptor(d)
		if strings.TrimSpace(loc.LeadingComments) == "" {
			t.Errorf("%s:%d: %s has no comment: document it in the .proto", d.ParentFile().Path(), loc.StartLine+1, d.FullName())
		}
		switch d := d.(type) {
		case protoreflect.MessageDescriptor:
			for i := range d.Fields().Len() {
				check(d.Fields().Get(i))
			}
			for i := range d.Messages().Len() {
				check(d.Messages().Get(i))
			}
			for i := range d.Enums().Len() {
				check(d.Enums().Get(i))
			}
		case protoreflect.EnumDescriptor:
			for i := range d.Values().Len() {
				check(d.Values().Get(i))
			}
		}
	}
	files.RangeFilesByPackage(protoPackage, func(f protoreflect.FileDescriptor) bool {
		for i := range f.Messages().Len() {
			check(f.Messages().Get(i))
		}
		for i := range f.Enums().Len() {
			check(f.Enums().Get(i))
		}
		return true
	})
}
