package skel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Diagnostics gathers an agent's diagnostics into one directory, for its Diagnostics
// method: a source that fails leaves its error in its file, so that what a person
// needs is kept however much of it could be learnt.
type Diagnostics struct {
	// Dir is the directory the files go into (the collect verb's --dir).
	Dir string

	files []string
	errs  []error
}

// Write writes data into the file name; a non-nil err, the source's, is appended to
// the data.
func (d *Diagnostics) Write(name string, data []byte, err error) {
	if err != nil {
		data = fmt.Appendf(data, "\n(error: %v)\n", err)
	}
	p := filepath.Join(d.Dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		d.errs = append(d.errs, err)
		return
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		d.errs = append(d.errs, err)
		return
	}
	d.files = append(d.files, p)
}

// Copy copies the file at path into the file name, if there is one at path.
func (d *Diagnostics) Copy(name, path string) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	d.Write(name, data, err)
}

// Files returns the paths of the files written, and what went wrong writing them.
func (d *Diagnostics) Files() ([]string, error) { return d.files, errors.Join(d.errs...) }
