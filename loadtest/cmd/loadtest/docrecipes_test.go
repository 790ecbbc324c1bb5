package main

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"regexp"
	"strings"
)

// The load-test recipes of the docs, read from the docs themselves so that
// a recipe cannot change without its test seeing it. A recipe is one
// loadtest command line of a code block, with what the block sets up
// around it: the stack it runs against (make run or bin/tollgate-stack,
// with the variables given on that line), files written with a heredoc, a
// second gateway joining the stack, and variables holding the stack's pid.

// docRecipe is one loadtest command line of a doc and its block's setup.
type docRecipe struct {
	doc  string // path as given to readRecipes
	line int    // of the command's first line
	cmd  string // the command, continuations joined, without "$ "

	stackEnv   map[string]string // make run's / bin/tollgate-stack's variables
	gatewayEnv map[string]string // a second bin/gateway's, nil when none
	files      map[string]string // heredocs: path -> content
	pidVars    []string          // NAME of NAME="$(cat bin/stack.pid)" (or pgrep … tollgate-stack) lines
}

// codeLine is one line of a code block with its line number.
type codeLine struct {
	n    int
	text string
}

// readRecipes returns the loadtest recipes of the markdown file path.
func readRecipes(path string) ([]docRecipe, error) {
	blocks, err := codeBlocks(path)
	if err != nil {
		return nil, err
	}
	var out []docRecipe
	files := map[string]string{} // written by the doc's blocks so far
	for _, b := range blocks {
		out = append(out, blockRecipes(path, b, files)...)
	}
	return out, nil
}

// codeBlocks returns the code blocks of a markdown file: fenced blocks,
// and runs of lines indented by four spaces or more after a blank line
// (without the indent).
func codeBlocks(path string) ([][]codeLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks    [][]codeLine
		cur       []codeLine
		fenced    bool
		prevBlank = true
		indented  bool
	)
	flush := func() {
		// Trailing blank lines of an indented block are not part of it.
		for len(cur) > 0 && strings.TrimSpace(cur[len(cur)-1].text) == "" {
			cur = cur[:len(cur)-1]
		}
		if len(cur) > 0 {
			blocks = append(blocks, cur)
		}
		cur = nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			if fenced {
				flush()
			}
			fenced = !fenced
		case fenced:
			cur = append(cur, codeLine{n, text})
		case strings.HasPrefix(text, "    ") && (indented || prevBlank):
			indented = true
			cur = append(cur, codeLine{n, text[4:]})
		case indented && trimmed == "":
			cur = append(cur, codeLine{n, ""})
		default:
			if indented {
				flush()
				indented = false
			}
		}
		prevBlank = trimmed == ""
	}
	flush()
	return blocks, sc.Err()
}

// Patterns of a block's commands.
var (
	heredocRe = regexp.MustCompile(`^cat > (\S+) <<'?(\w+)'?$`)
	assignRe  = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)
	pidVarRe  = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)="\$\((?:pgrep .*tollgate-stack|cat bin/stack\.pid)\)"`)
	// A usage line, not a command: loadtest -target proxy|check|grpc …
	usageRe = regexp.MustCompile(`\[|\|\w+\|`)
	chaosRe = regexp.MustCompile(`^(bin/)?loadtest chaos\b`)
)

// blockRecipes returns the loadtest commands of one code block. files
// holds the files the doc's earlier blocks wrote, as a reader following
// the doc has them; the block's own are added to it.
func blockRecipes(doc string, block []codeLine, files map[string]string) []docRecipe {
	// A block with prompts shows a session: only the prompted lines are
	// commands, the rest is their output.
	prompted := false
	for _, l := range block {
		prompted = prompted || strings.HasPrefix(l.text, "$ ")
	}
	type command struct {
		n    int
		text string
	}
	var cmds []command
	for i := 0; i < len(block); i++ {
		l := block[i]
		text := l.text
		if prompted {
			if !strings.HasPrefix(text, "$ ") {
				continue
			}
			text = strings.TrimPrefix(text, "$ ")
		}
		text = strings.TrimSpace(text)
		for strings.HasSuffix(text, `\`) && i+1 < len(block) {
			i++
			text = strings.TrimSpace(strings.TrimSuffix(text, `\`)) + " " + strings.TrimSpace(block[i].text)
		}
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		cmds = append(cmds, command{l.n, text})
	}

	setup := docRecipe{doc: doc, files: files}
	var loads []command
	written := map[string]bool{}
	for i := 0; i < len(cmds); i++ {
		c := cmds[i]
		if m := heredocRe.FindStringSubmatch(c.text); m != nil {
			for i++; i < len(cmds) && cmds[i].text != m[2]; i++ {
			}
			written[m[1]] = true
			continue
		}
		if m := pidVarRe.FindStringSubmatch(c.text); m != nil {
			setup.pidVars = append(setup.pidVars, m[1])
			continue
		}
		env, prog := splitEnv(stripComment(c.text))
		switch {
		case prog == "make run" || strings.HasPrefix(prog, "bin/tollgate-stack"):
			setup.stackEnv = env
		case strings.HasPrefix(prog, "bin/gateway"):
			setup.gatewayEnv = env
		case chaosRe.MatchString(prog):
			// The chaos soak starts a fleet of its own, not against a
			// stack: make soak runs it, and its tests are in chaos_test.go.
		case (strings.HasPrefix(prog, "bin/loadtest ") || strings.HasPrefix(prog, "loadtest ")) && !usageRe.MatchString(prog):
			loads = append(loads, command{c.n, prog})
		}
	}
	// Heredocs hold their lines as written: re-read them from the block,
	// comments and indentation included.
	for path := range written {
		files[path] = heredocBody(block, path)
	}
	var out []docRecipe
	for _, l := range loads {
		r := setup
		r.files = maps.Clone(files)
		r.line, r.cmd = l.n, l.text
		out = append(out, r)
	}
	return out
}

// heredocBody returns the body of the heredoc that writes path, as written.
func heredocBody(block []codeLine, path string) string {
	var body []string
	tag := ""
	for _, l := range block {
		t := strings.TrimSpace(l.text)
		switch {
		case tag == "":
			if m := heredocRe.FindStringSubmatch(t); m != nil && m[1] == path {
				tag = m[2]
			}
		case t == tag:
			return strings.Join(body, "\n") + "\n"
		default:
			body = append(body, l.text)
		}
	}
	return strings.Join(body, "\n") + "\n"
}

// stripComment drops a trailing shell comment (" # …" outside quotes).
func stripComment(s string) string {
	quote := byte(0)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && i > 0 && s[i-1] == ' ':
			return strings.TrimSpace(s[:i])
		}
	}
	return s
}

// splitEnv splits "A=1 B=2 prog args" into the variables and the rest.
func splitEnv(s string) (map[string]string, string) {
	env := map[string]string{}
	for {
		s = strings.TrimSpace(s)
		if !assignRe.MatchString(s) {
			return env, s
		}
		end := strings.IndexByte(s, ' ')
		if end < 0 {
			end = len(s)
		}
		kv := s[:end]
		k, v, _ := strings.Cut(kv, "=")
		env[k] = strings.Trim(v, `"'`)
		s = s[end:]
	}
}

// shellWords splits a command line into words as a shell would, for the
// forms the docs use: 'single' and "double" quotes, nothing else expanded.
// A pipe or a redirection ends the command.
func shellWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote byte
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case c == '|' || c == '>' || c == '&' || c == ';':
			if in {
				words = append(words, cur.String())
			}
			return words, nil
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}
