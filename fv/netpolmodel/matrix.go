package netpolmodel

import (
	"fmt"
	"strings"
	"text/tabwriter"

	networkingv1 "k8s.io/api/networking/v1"
)

// Matrix is connectivity over ordered pairs of pods and ports: for each cell, from a
// pod to a pod on a port, whether a connection is allowed, if known.
type Matrix struct {
	Pods  []string // pod IDs, in the order of rows and columns
	Ports []Port   // in the order of tables

	cells   map[cellKey]bool
	reasons map[cellKey]string
}

type cellKey struct {
	from, to string
	port     Port
}

func key(from, to string, port Port) cellKey { return cellKey{from, to, port.normal()} }

// NewMatrix returns a matrix over pods (IDs) and ports with no cell known.
func NewMatrix(pods []string, ports []Port) *Matrix {
	return &Matrix{Pods: pods, Ports: ports, cells: map[cellKey]bool{}, reasons: map[cellKey]string{}}
}

// Set records whether a connection from pod from to pod to on port is allowed.
func (m *Matrix) Set(from, to string, port Port, allowed bool) {
	if m.cells == nil {
		m.cells = map[cellKey]bool{}
	}
	m.cells[key(from, to, port)] = allowed
}

// Get returns whether a connection from pod from to pod to on port is allowed, and
// whether the matrix knows.
func (m *Matrix) Get(from, to string, port Port) (allowed, known bool) {
	allowed, known = m.cells[key(from, to, port)]
	return allowed, known
}

// Reason returns why the model expects what it does of the cell, for a matrix that
// Expected returned; "" otherwise.
func (m *Matrix) Reason(from, to string, port Port) string {
	return m.reasons[key(from, to, port)]
}

// Expected returns the connectivity the policies allow in the cluster: every ordered
// pair of distinct pods, on every port, with the reason for each cell.
func (c Cluster) Expected(policies []networkingv1.NetworkPolicy, ports []Port) *Matrix {
	m := NewMatrix(c.IDs(), ports)
	for i, src := range c.Pods {
		for j, dst := range c.Pods {
			if i == j {
				continue
			}
			for _, port := range ports {
				allowed, why := c.Allowed(policies, src, dst, port)
				m.Set(src.ID(), dst.ID(), port, allowed)
				m.reasons[key(src.ID(), dst.ID(), port)] = why
			}
		}
	}
	return m
}

// Cell is one cell of a comparison of an observed matrix with the expected one.
type Cell struct {
	From, To   string
	Port       Port
	Expected   bool
	Observed   bool
	Unobserved bool   // observed has no value for the cell; Observed is then false
	Reason     string // why the model expects Expected, when it does
}

// String returns "x/a -> y/b TCP/80: expected allowed, observed denied".
func (c Cell) String() string {
	observed := verdict(c.Observed)
	if c.Unobserved {
		observed = "not observed"
	}
	return fmt.Sprintf("%s -> %s %s: expected %s, observed %s", c.From, c.To, c.Port, verdict(c.Expected), observed)
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// Compare returns the cells where observed differs from expected, or has no value,
// in the order of expected's ports, rows and columns; and how many of the total
// cells that expected knows were right. It compares pairs of distinct pods of
// expected only: cells that only observed knows, and a pod to itself, are ignored.
func Compare(expected, observed *Matrix) (wrong []Cell, right, total int) {
	return compare(expected, observed, expected.Ports)
}

func compare(expected, observed *Matrix, ports []Port) (wrong []Cell, right, total int) {
	for _, port := range ports {
		for _, from := range expected.Pods {
			for _, to := range expected.Pods {
				want, known := expected.Get(from, to, port)
				if !known || from == to {
					continue
				}
				total++
				var got, seen bool
				if observed != nil {
					got, seen = observed.Get(from, to, port)
				}
				if seen && got == want {
					right++
					continue
				}
				wrong = append(wrong, Cell{From: from, To: to, Port: port, Expected: want, Observed: got,
					Unobserved: !seen, Reason: expected.Reason(from, to, port)})
			}
		}
	}
	return wrong, right, total
}

// maxListed bounds the wrong cells Render lists with their reasons; the tables show
// all of them.
const maxListed = 20

// Render prints, for a person reading a failure, one table per port of expected:
// rows are the pods connections come from, columns the pods they go to. A cell is
// '.' if allowed, 'X' if denied, '-' for a pod to itself and '?' if expected has no
// value. Where observed (which may be nil) differs from expected, the cell shows what
// was observed, marked '!', and the wrong cells follow the tables with the reason the
// model expects otherwise.
func Render(expected, observed *Matrix) string {
	var b strings.Builder
	b.WriteString("Reachability, rows from, columns to: . allowed, X denied, - self, ? no value.\n")
	if observed != nil {
		b.WriteString("A wrong cell shows what was observed, marked !: X! denied but expected allowed, .! allowed but expected denied, ?! not observed.\n")
	}
	wrong, right, total := Compare(expected, observed)
	for _, port := range expected.Ports {
		b.WriteString("\n")
		if observed != nil {
			wrong, _, total := compare(expected, observed, []Port{port})
			fmt.Fprintf(&b, "%s: %d of %d wrong\n", port, len(wrong), total)
		} else {
			fmt.Fprintf(&b, "%s: expected\n", port)
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "from\\to")
		for _, to := range expected.Pods {
			fmt.Fprintf(tw, "\t%s", to)
		}
		fmt.Fprintln(tw)
		for _, from := range expected.Pods {
			fmt.Fprint(tw, from)
			for _, to := range expected.Pods {
				fmt.Fprintf(tw, "\t%s", mark(expected, observed, from, to, port))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
	if observed == nil {
		return b.String()
	}
	fmt.Fprintf(&b, "\n%d of %d cells right", right, total)
	if len(wrong) == 0 {
		b.WriteString("\n")
		return b.String()
	}
	fmt.Fprintf(&b, "; wrong:\n")
	for i, c := range wrong {
		if i == maxListed {
			fmt.Fprintf(&b, "  ... and %d more\n", len(wrong)-maxListed)
			break
		}
		fmt.Fprintf(&b, "  %s", c)
		if c.Reason != "" {
			fmt.Fprintf(&b, " (model: %s)", c.Reason)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func mark(expected, observed *Matrix, from, to string, port Port) string {
	if from == to {
		return "-"
	}
	want, known := expected.Get(from, to, port)
	if !known {
		return "?"
	}
	if observed == nil {
		return symbol(want)
	}
	got, seen := observed.Get(from, to, port)
	switch {
	case !seen:
		return "?!"
	case got != want:
		return symbol(got) + "!"
	default:
		return symbol(got)
	}
}

func symbol(allowed bool) string {
	if allowed {
		return "."
	}
	return "X"
}
