package topologies

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// localHost runs commands here, as a host whose namespace is this process's.
type localHost struct{}

func (localHost) Name() string              { return "local" }
func (localHost) IP() netip.Addr            { return netip.Addr{} }
func (localHost) Start(cmd *exec.Cmd) error { return cmd.Start() }

// TestOutputKeepsStderrOutOfStdout: a tool that writes to stderr while part of its
// stdout is still to come (conntrack -L: its buffered entries, then "N flow entries
// have been shown" on stderr, then the rest at exit) must not have that line land
// inside its output, where it split an entry that a parser then missed.
func TestOutputKeepsStderrOutOfStdout(t *testing.T) {
	ctx := context.Background()
	out, err := Output(ctx, localHost{}, "sh", "-c", `printf 'tcp 6 ESTABLISHED src=10.0.0.1 dpor'; echo '2 flow entries have been shown.' >&2; printf 't=80\n'`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "tcp 6 ESTABLISHED src=10.0.0.1 dport=80\n"; got != want {
		t.Errorf("Output = %q, want %q", got, want)
	}
	_, err = Output(ctx, localHost{}, "sh", "-c", `echo partial; echo 'no such table' >&2; exit 3`)
	if err == nil || !strings.Contains(err.Error(), "no such table") {
		t.Errorf("a failed command's error = %v, want it to say what the command wrote to stderr", err)
	}
	_, err = Output(ctx, localHost{}, "sh", "-c", `echo 'usage: only on stdout'; exit 2`)
	if err == nil || !strings.Contains(err.Error(), "usage: only on stdout") {
		t.Errorf("a failed command's error = %v, want its stdout when its stderr is empty", err)
	}
}
