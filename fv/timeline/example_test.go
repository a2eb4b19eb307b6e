package timeline_test

import (
	"fmt"
	"time"

	"github.com/dpconform/dpconform/fv/timeline"
)

func ExampleWindow_Relative() {
	tl := timeline.New()
	tl.RecordAt(10_000*ms, timeline.StopSent, "SIGTERM")
	tl.RecordAt(10_150*ms, timeline.Exited, "")
	tl.RecordAt(10_900*ms, timeline.Ready, "")
	w, err := tl.TransitionWindow(timeline.DefaultLead, 3*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println(w)
	fmt.Println(w.Relative(10_132 * ms))
	// Output:
	// window from 1.0 s before stop-sent to 3.0 s after ready (4.9 s)
	// 132.0 ms after stop-sent (18.0 ms before exited)
}
