// Package monotime reads CLOCK_MONOTONIC, the clock the suite and every probe stamp
// by: all network namespaces of a machine see the same monotonic clock, so events
// stamped by different processes in different namespaces line up on one timeline.
// Hosts of other clocks (other machines, time namespaces) are related to it by
// measurement (package clocks).
package monotime

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Time is a reading of CLOCK_MONOTONIC in nanoseconds. Zero means "not set".
type Time int64

// Now reads CLOCK_MONOTONIC.
func Now() Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; a failure here means the process is
		// not on Linux at all, and no measurement would mean anything.
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return Time(ts.Nano())
}

// Since is the time elapsed since t.
func Since(t Time) time.Duration { return time.Duration(Now() - t) }

// Sub returns t-u.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// Add returns t+d.
func (t Time) Add(d time.Duration) Time { return t + Time(d) }

// Before reports whether t is before u.
func (t Time) Before(u Time) bool { return t < u }

// After reports whether t is after u.
func (t Time) After(u Time) bool { return t > u }

// IsZero reports whether t is unset.
func (t Time) IsZero() bool { return t == 0 }

// Wall converts t to a wall-clock time.Time, for the moments a person needs a date. It
// is only as exact as the two clock readings it pairs.
func (t Time) Wall() time.Time {
	now, wall := Now(), time.Now()
	return wall.Add(t.Sub(now))
}

// Deadline converts t to the time.Time that deadlines of the net and os packages take.
func (t Time) Deadline() time.Time { return time.Now().Add(Until(t)) }

// Until is the time remaining until t.
func Until(t Time) time.Duration { return time.Duration(t - Now()) }

// String formats t as seconds since boot, the unit a person reads in a dump.
func (t Time) String() string { return fmt.Sprintf("%.6fs", float64(t)/1e9) }

// SleepUntil blocks the calling thread in the kernel until CLOCK_MONOTONIC reaches t
// (clock_nanosleep, TIMER_ABSTIME), to within the kernel's timer slack (50 µs by
// default) instead of the millisecond that the Go runtime's timers keep when the
// process is otherwise idle (they wake through epoll_pwait, whose timeout is in
// milliseconds). It holds an OS thread for the whole sleep: meant for sleeps of a
// millisecond or less. A t in the past returns at once.
func SleepUntil(t Time) {
	ts := unix.NsecToTimespec(int64(t))
	for {
		// EINTR (the runtime preempts with signals): an absolute deadline needs no
		// adjustment to resume.
		if err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil); err != unix.EINTR {
			return
		}
	}
}
