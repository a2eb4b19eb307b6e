package iptables

import (
	"fmt"
	"strings"
)

// dump is the parsed output of iptables-save: what the kernel holds, read once, so that
// a change is computed from it and applied in one iptables-restore transaction instead
// of probing the kernel rule by rule.
type dump struct {
	tables []*table
}

// table is one table of a dump.
type table struct {
	name string
	// chains are the chains declared in the table, built-in and user-defined, in the
	// order iptables-save printed them.
	chains []string
	// builtin holds the chains declared with a policy (built-in chains).
	builtin map[string]bool
	rules   []rule
}

// rule is one "-A CHAIN ..." line.
type rule struct {
	chain string
	// spec is the line after "-A CHAIN ": what "-D CHAIN spec" deletes in
	// iptables-restore, exactly as iptables-save printed it.
	spec string
	// target is the chain or target of the rule's -j or -g ("" without one).
	target string
}

// table returns the table name, or nil.
func (d *dump) table(name string) *table {
	for _, t := range d.tables {
		if t.name == name {
			return t
		}
	}
	return nil
}

// has reports whether chain is declared in t.
func (t *table) has(chain string) bool {
	for _, c := range t.chains {
		if c == chain {
			return true
		}
	}
	return false
}

// rulesOf returns the rules of chain, in order.
func (t *table) rulesOf(chain string) []rule {
	var out []rule
	for _, r := range t.rules {
		if r.chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// parseSave parses iptables-save output (without -c). Comments and COMMIT lines are
// skipped; anything else it does not understand is an error, so that a format change
// does not silently turn into rules left behind.
func parseSave(text string) (*dump, error) {
	d := &dump{}
	var cur *table
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &table{name: line[1:], builtin: map[string]bool{}}
			d.tables = append(d.tables, cur)
		case cur == nil:
			return nil, fmt.Errorf("iptables-save line %d outside a table: %q", i+1, line)
		case line == "COMMIT":
			cur = nil
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return nil, fmt.Errorf("iptables-save line %d: bad chain declaration %q", i+1, line)
			}
			cur.chains = append(cur.chains, f[0])
			if f[1] != "-" {
				cur.builtin[f[0]] = true
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[len("-A "):], " ")
			r := rule{chain: chain, spec: spec}
			toks, err := tokens(spec)
			if err != nil {
				return nil, fmt.Errorf("iptables-save line %d: %w", i+1, err)
			}
			for j := 0; j+1 < len(toks); j++ {
				switch toks[j] {
				case "-j", "--jump", "-g", "--goto":
					r.target = toks[j+1]
				}
			}
			cur.rules = append(cur.rules, r)
		default:
			return nil, fmt.Errorf("iptables-save line %d: unexpected %q", i+1, line)
		}
	}
	return d, nil
}

// tokens splits a rule spec into words as iptables-restore does: double quotes group
// (iptables-save quotes comments), a backslash escapes the next character. A comment
// that reads "-j KUBE-SERVICES" is one word, not a jump.
func tokens(s string) ([]string, error) {
	var out []string
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == '"':
			quoted = !quoted
			inWord = true
		case (c == ' ' || c == '\t') && !quoted:
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, w.String())
	}
	return out, nil
}
