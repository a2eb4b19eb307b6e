package netpolmodel_test

import (
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dpconform/dpconform/fv/netpolmodel"
)

// denyIngressX isolates x's pods for ingress with no rule.
var denyIngressX = []networkingv1.NetworkPolicy{policy("x", "deny-ingress", all(), networkingv1.NetworkPolicySpec{})}

// observe returns a copy of m, as a dataplane that behaves exactly as expected
// would be observed.
func observe(m *netpolmodel.Matrix) *netpolmodel.Matrix {
	o := netpolmodel.NewMatrix(m.Pods, m.Ports)
	for _, port := range m.Ports {
		for _, from := range m.Pods {
			for _, to := range m.Pods {
				if allowed, known := m.Get(from, to, port); known {
					o.Set(from, to, port, allowed)
				}
			}
		}
	}
	return o
}

func TestMatrix(t *testing.T) {
	m := netpolmodel.NewMatrix([]string{"x/a", "x/b"}, []netpolmodel.Port{tcp80})
	if _, known := m.Get("x/a", "x/b", tcp80); known {
		t.Error("a new matrix knows a cell")
	}
	m.Set("x/a", "x/b", netpolmodel.Port{Port: 80}, true)
	if allowed, known := m.Get("x/a", "x/b", tcp80); !allowed || !known {
		t.Errorf("after Set with the protocol defaulted: %v %v, want true true", allowed, known)
	}
	if _, known := m.Get("x/b", "x/a", tcp80); known {
		t.Error("Set of one direction made the other known")
	}
	var zero netpolmodel.Matrix
	zero.Set("x/a", "x/b", tcp80, false)
	if allowed, known := zero.Get("x/a", "x/b", tcp80); allowed || !known {
		t.Errorf("zero matrix after Set: %v %v, want false true", allowed, known)
	}
}

func TestExpectedCoversDistinctPairs(t *testing.T) {
	c := fixture()
	m := c.Expected(denyIngressX, fixturePorts)
	if got, want := strings.Join(m.Pods, " "), "x/a x/b x/c y/a y/b y/c z/a z/b z/c"; got != want {
		t.Errorf("pods %s, want %s", got, want)
	}
	known := 0
	for _, port := range m.Ports {
		for _, from := range m.Pods {
			for _, to := range m.Pods {
				_, ok := m.Get(from, to, port)
				if ok {
					known++
				}
				if from == to && ok {
					t.Errorf("a self-pair %s %s is known", from, port)
				}
			}
		}
	}
	if known != 9*8*4 {
		t.Errorf("%d cells known, want %d", known, 9*8*4)
	}
	if r := m.Reason("y/a", "x/b", tcp80); !strings.Contains(r, "x/b ingress isolated by [x/deny-ingress]") {
		t.Errorf("reason %q", r)
	}
}

func TestCompare(t *testing.T) {
	c := fixture()
	expected := c.Expected(denyIngressX, fixturePorts)
	total := 9 * 8 * 4

	t.Run("as expected", func(t *testing.T) {
		wrong, right, n := netpolmodel.Compare(expected, observe(expected))
		if len(wrong) != 0 || right != total || n != total {
			t.Errorf("%d wrong, %d right of %d; want 0, %d of %d", len(wrong), right, n, total, total)
		}
	})

	t.Run("a leak and a drop", func(t *testing.T) {
		observed := observe(expected)
		observed.Set("y/a", "x/b", udp81, true)  // denied by x's ingress
		observed.Set("x/a", "z/c", tcp80, false) // allowed
		wrong, right, n := netpolmodel.Compare(expected, observed)
		if right != total-2 || n != total {
			t.Errorf("%d right of %d, want %d of %d", right, n, total-2, total)
		}
		if len(wrong) != 2 {
			t.Fatalf("wrong %v, want 2 cells", wrong)
		}
		// In the order of ports, then rows.
		if got, want := wrong[0].String(), "x/a -> z/c TCP/80: expected allowed, observed denied"; got != want {
			t.Errorf("wrong[0] %q, want %q", got, want)
		}
		if got, want := wrong[1].String(), "y/a -> x/b UDP/81: expected denied, observed allowed"; got != want {
			t.Errorf("wrong[1] %q, want %q", got, want)
		}
		if !strings.Contains(wrong[1].Reason, "x/b ingress isolated by [x/deny-ingress]") {
			t.Errorf("wrong[1] reason %q", wrong[1].Reason)
		}
	})

	t.Run("an unobserved cell is wrong", func(t *testing.T) {
		observed := netpolmodel.NewMatrix(expected.Pods, expected.Ports)
		observed.Set("x/a", "x/b", tcp80, false)
		wrong, right, n := netpolmodel.Compare(expected, observed)
		if right != 1 || n != total || len(wrong) != total-1 {
			t.Errorf("%d wrong, %d right of %d; want %d, 1 of %d", len(wrong), right, n, total-1, total)
		}
		if !wrong[0].Unobserved || !strings.Contains(wrong[0].String(), "not observed") {
			t.Errorf("wrong[0] %+v, want unobserved", wrong[0])
		}
	})

	t.Run("nil observed", func(t *testing.T) {
		wrong, right, n := netpolmodel.Compare(expected, nil)
		if len(wrong) != total || right != 0 || n != total {
			t.Errorf("%d wrong, %d right of %d; want all wrong", len(wrong), right, n)
		}
	})
}

// table returns the rows of Render's table for port, each split into its fields:
// the header first, then one per pod.
func table(t *testing.T, out string, port netpolmodel.Port) [][]string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, port.String()+":") {
			continue
		}
		var rows [][]string
		for _, row := range lines[i+1:] {
			if row == "" {
				break
			}
			rows = append(rows, strings.Fields(row))
		}
		return rows
	}
	t.Fatalf("no table for %s in:\n%s", port, out)
	return nil
}

func TestRender(t *testing.T) {
	c := fixture()
	expected := c.Expected(denyIngressX, fixturePorts)
	observed := observe(expected)
	observed.Set("y/a", "x/b", udp81, true)
	observed.Set("x/a", "z/c", tcp80, false)
	observed.Set("z/a", "x/c", tcp81, false) // as expected: not marked
	out := render(t, expected, observed)

	marked := map[string]string{"UDP/81 y/a x/b": ".!", "TCP/80 x/a z/c": "X!"}
	for _, port := range fixturePorts {
		rows := table(t, out, port)
		if len(rows) != 1+9 {
			t.Fatalf("%s: %d rows, want 10:\n%s", port, len(rows), out)
		}
		header := rows[0]
		for _, row := range rows[1:] {
			from := row[0]
			for j, got := range row[1:] {
				to := header[j+1]
				want := "."
				switch {
				case from == to:
					want = "-"
				case marked[port.String()+" "+from+" "+to] != "":
					want = marked[port.String()+" "+from+" "+to]
				case to[0] == 'x':
					want = "X"
				}
				if got != want {
					t.Errorf("%s %s -> %s: %q, want %q", port, from, to, got, want)
				}
			}
		}
	}
	for _, s := range []string{
		"TCP/80: 1 of 72 wrong", "TCP/81: 0 of 72 wrong", "UDP/81: 1 of 72 wrong",
		"286 of 288 cells right; wrong:",
		"  x/a -> z/c TCP/80: expected allowed, observed denied (model: x/a egress not isolated; z/c ingress not isolated)",
		"  y/a -> x/b UDP/81: expected denied, observed allowed (model: x/b ingress isolated by [x/deny-ingress], no rule allows y/a -> x/b UDP/81)",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in:\n%s", s, out)
		}
	}
}

func TestRenderExpectedOnly(t *testing.T) {
	out := render(t, fixture().Expected(denyIngressX, fixturePorts), nil)
	if strings.Contains(out, "!") || strings.Contains(out, "wrong") {
		t.Errorf("marks without an observed matrix:\n%s", out)
	}
	if rows := table(t, out, udp80); strings.Join(rows[2], " ") != "x/b X - X . . . . . ." {
		t.Errorf("row x/b %q:\n%s", rows[2], out)
	}
}

func TestRenderListsAtMostSomeWrongCells(t *testing.T) {
	expected := fixture().Expected(nil, fixturePorts)
	out := render(t, expected, netpolmodel.NewMatrix(expected.Pods, expected.Ports))
	if !strings.Contains(out, "0 of 288 cells right") || !strings.Contains(out, "... and 268 more") {
		t.Errorf("want 20 of the 288 wrong cells listed:\n%s", out)
	}
	if n := strings.Count(out, "?!"); n < 288 {
		t.Errorf("%d cells marked ?!, want all 288 (and the legend):\n%s", n, out)
	}
}

// render renders and logs, so that a failing test shows the table as a person would.
func render(t *testing.T, expected, observed *netpolmodel.Matrix) string {
	t.Helper()
	out := netpolmodel.Render(expected, observed)
	t.Log("\n" + out)
	return out
}
