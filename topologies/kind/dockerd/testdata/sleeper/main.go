// Command sleeper is the one program of the dockerd test's image: it prints its
// capabilities' bounding set and sleeps until it is stopped.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "CapBnd:") {
			fmt.Println(l)
		}
	}
	if len(os.Args) > 1 && os.Args[1] == "once" {
		return
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
