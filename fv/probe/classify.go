package probe

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// classify maps an error of a socket operation to an Outcome and a short reason that
// names the phase ("connect", "send", "reply") and the errno.
//
// A RST in answer to a SYN surfaces on Linux as ECONNREFUSED (Refused); a RST on an
// established connection as ECONNRESET, or EPIPE on a write after it (Reset). Both
// mean "something answered with a RST". A deadline, or ETIMEDOUT from the kernel's own
// retransmission limit, is a Timeout; it is never confused with a RST.
func classify(phase string, err error) (Outcome, string) {
	var errno syscall.Errno
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused, phase + ": connection refused (RST or ICMP port unreachable)"
	case errors.Is(err, syscall.ECONNRESET):
		return Reset, phase + ": connection reset (RST)"
	case errors.Is(err, syscall.EPIPE):
		return Reset, phase + ": broken pipe (connection reset)"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return Timeout, phase + ": no answer before the deadline"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return Unreachable, phase + ": " + errnoText(err)
	case errors.Is(err, io.EOF):
		return NoReply, phase + ": closed by the peer (FIN) without a reply"
	case errors.As(err, &errno):
		return LocalError, phase + ": " + errno.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Timeout, phase + ": no answer before the deadline"
	}
	return LocalError, phase + ": " + err.Error()
}

func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
