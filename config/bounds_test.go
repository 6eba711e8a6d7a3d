package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
)

const boundsHead = "model: {primary: 'openai:x'}\n"

// hostileFiles are files built to make a YAML parser work far more than
// their size: each must be refused by the bounds of bounds.go, with one
// problem at its place. want matches the whole message.
var hostileFiles = []struct {
	name string
	// write writes the file (some are too large to build in memory).
	write func(f *os.File) error
	want  string
}{
	{"over 1 MiB", text(boundsHead + strings.Repeat("# a comment line, repeated until the file is too large\n", 20000)),
		`^agent\.yaml:19066:28: the file is larger than 1 MiB \(an agent file holds settings and tool declarations; keep it under 1 MiB and put large data in the files it names\)$`},
	{"a 50 MB comment line", func(f *os.File) error {
		if _, err := f.WriteString(boundsHead + "#"); err != nil {
			return err
		}
		chunk := []byte(strings.Repeat("a", 1<<20))
		for range 50 {
			if _, err := f.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}, `^agent\.yaml:2:1048548: the file is larger than 1 MiB`},
	{"40,000 levels of flow lists", text(boundsHead + "x-deep: " + strings.Repeat("[", 40000) + strings.Repeat("]", 40000) + "\n"),
		`^agent\.yaml:2:108: x-deep: nests more than 100 levels deep \(an agent file needs a handful; flatten it\)$`},
	{"flow mappings", text(boundsHead + "tools: " + strings.Repeat("{a: ", 5000) + strings.Repeat("}", 5000) + "\n"),
		`^agent\.yaml:2:404: tools: nests more than 100 levels deep`},
	{"dashes on one line", text(boundsHead + "x-deep: " + strings.Repeat("- ", 20000) + "a\n"),
		`^agent\.yaml:2:207: x-deep\[0\]\[0\]\[0\]\[0\]\[0\]…: nests more than 100 levels deep`},
	{"indentation", text(boundsHead + deepIndent(150)),
		`^agent\.yaml:102:101: k0\.k1\.k2\.k3\.k4\.k5…: nests more than 100 levels deep`},
	{"empty entries (goccy nests them)", text(boundsHead + "x-deep:\n" + strings.Repeat("-\nk:\n", 200)),
		`^agent\.yaml:\d+:\d+: x-deep\[0\]\.k\[0\]\.k\[0\]…: nests more than 100 levels deep`},
	{"tags in a row", text(boundsHead + "name: " + strings.Repeat("!!str ", 20000) + "x\n"),
		`^agent\.yaml:2:502: name: nests more than 100 levels deep`},
	{"anchors in a row", text(boundsHead + "name: " + anchors(20000) + "x\n"),
		`^agent\.yaml:2:\d+: name: nests more than 100 levels deep`},
	{"20,000 keys in one mapping", text(boundsHead + "x-wide:\n" + manyKeys(20000)),
		`^agent\.yaml:1003:3: x-wide: has more than 1000 keys \(an agent file needs far fewer; split the data into a file the tool reads\)$`},
	{"300,000 list items", text(boundsHead + "x-long: [" + strings.Repeat("a,", 300000) + "]\n"),
		`^agent\.yaml:2:\d+: the file has more than 250000 words and punctuation marks; an agent file needs far fewer`},
	{"120,000 list items", text(boundsHead + "x-long: [" + strings.Repeat("a,", 120000) + "]\n"),
		`^agent\.yaml:2:100000: the file has more than 100000 YAML tokens \(keys, values and punctuation\); an agent file needs far fewer`},
	{"billion laughs", text(boundsHead + laughs(9)),
		`^agent\.yaml:6:12: x-l4\[0\]: aliases stand for more than 10000 values in all \(\*l3 repeats 7381\); an alias repeats its anchor's whole value, so aliases of aliases multiply \(write the values out, or use fewer aliases\)$`},
	{"merges of merges", text(boundsHead + mergeBomb(40) + "timeouts: {<<: *a39}\n"),
		`^agent\.yaml:\d+:\d+: x-a\d+\.<<\[\d\]: aliases stand for more than 10000 values in all`},
	{"an alias inside its own anchor", text(boundsHead + "tools: [{name: a, exec: [x], input_schema: &s {type: object, properties: {a: *s}}}]\n"),
		`^agent\.yaml:2:78: tools\[0\]\.input_schema\.properties\.a: alias \*s is inside the value of its own anchor &s, so it would repeat itself for ever \(refer to a value that is complete\)$`},
}

func text(s string) func(*os.File) error {
	return func(f *os.File) error { _, err := f.WriteString(s); return err }
}

func deepIndent(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%sk%d:\n", strings.Repeat(" ", i), i)
	}
	return b.String()
}

func anchors(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "&a%d ", i)
	}
	return b.String()
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  k%d: 1\n", i)
	}
	return b.String()
}

// laughs is the "billion laughs": each anchor a list of nine aliases of
// the one before.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString("x-l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < levels; i++ {
		fmt.Fprintf(&b, "x-l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 9), ", "))
	}
	return b.String()
}

// mergeBomb merges each anchor twice into the next.
func mergeBomb(levels int) string {
	var b strings.Builder
	b.WriteString("x-a0: &a0 {k: 1}\n")
	for i := 1; i < levels; i++ {
		fmt.Fprintf(&b, "x-a%d: &a%d {<<: [*a%d, *a%d], k%d: 1}\n", i, i, i-1, i-1, i)
	}
	return b.String()
}

// TestHostileFiles loads each hostile file and checks that it is refused
// with one problem in the spec's form (file:line:col: key: problem (fix)),
// and that refusing it allocates little: the same files took seconds and
// gigabytes before the bounds. The allocation bound is generous; the
// figures are in BenchmarkHostileFiles.
func TestHostileFiles(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for i, c := range hostileFiles {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("h%d.yaml", i)
			writeFile(t, name, c.write)
			// The message names the file as given; compare with agent.yaml.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			a, err := Load(name, Overrides{})
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if a != nil || err == nil {
				t.Fatal("loaded")
			}
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("want one problem, got %v", err)
			}
			got := strings.Replace(es[0].Error(), name, "agent.yaml", 1)
			if !regexp.MustCompile(c.want).MatchString(got) {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("refused in %v, %d MiB allocated", took.Round(time.Millisecond), alloc>>20)
			if alloc > 100<<20 {
				t.Errorf("refusing it allocated %d MiB, want well under 100", alloc>>20)
			}
		})
	}
}

// BenchmarkHostileFiles measures the time and memory of refusing each
// hostile file (go test ./config -run - -bench HostileFiles -benchmem).
func BenchmarkHostileFiles(b *testing.B) {
	dir := b.TempDir()
	for i, c := range hostileFiles {
		path := filepath.Join(dir, fmt.Sprintf("h%d.yaml", i))
		writeFile(b, path, c.write)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Load(path, Overrides{}); err == nil {
					b.Fatal("loaded")
				}
			}
		})
	}
}

func writeFile(t testing.TB, path string, write func(*os.File) error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBoundsLetRealFilesThrough loads a file at the edge of each bound:
// it must load.
func TestBoundsLetRealFilesThrough(t *testing.T) {
	var b strings.Builder
	b.WriteString(boundsHead)
	b.WriteString("x-deep: " + strings.Repeat("[", MaxNesting-1) + strings.Repeat("]", MaxNesting-1) + "\n")
	b.WriteString("x-wide:\n" + manyKeys(MaxKeys))
	b.WriteString(laughs(4)) // 9 + 81 + 729 values behind aliases
	// Half a megabyte of prose is one token, though many words.
	b.WriteString("instructions: |\n" + strings.Repeat("  A long line of instructions, with some punctuation: commas, colons; and [brackets].\n", 6000))
	path := writeAgent(t, b.String())
	if _, err := Load(path, Overrides{}); err != nil {
		t.Fatal(err)
	}
}

// TestAgentFileNotRegular: a FIFO, a device or a directory in place of
// the agent file is refused at once; the FIFO, which has no writer, must
// not block the open.
func TestAgentFileNotRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "agent.yaml")
	testenv.Mkfifo(t, fifo)
	for _, c := range []struct{ path, want string }{
		{fifo, fifo + ": the agent file is a named pipe (FIFO), not a regular file (give the path of a YAML file)"},
		{"/dev/zero", "/dev/zero: the agent file is a character device, not a regular file (give the path of a YAML file)"},
		{t.TempDir(), "the agent file is a directory, not a regular file"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := Load(c.path, Overrides{})
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: got %v\nwant %s", c.path, err, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Load blocked", c.path)
		}
	}
}
