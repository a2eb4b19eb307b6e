package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

// TestWithoutBlobs: an image archive sent to a kind node leaves out the blobs the node
// has, and keeps everything else as it was.
func TestWithoutBlobs(t *testing.T) {
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	files := []struct{ name, body string }{
		{"blobs/", ""},
		{"blobs/sha256/", ""},
		{"blobs/sha256/aaaa", "the base layer"},
		{"blobs/sha256/bbbb", "refdp's layer"},
		{"index.json", "{}"},
		{"manifest.json", "[]"},
	}
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
		if f.body == "" {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.body))
	}
	tw.Close()

	out, dropped, err := withoutBlobs(in.Bytes(), []string{"sha256:aaaa", "sha256:cccc", "nonsense"})
	if err != nil {
		t.Fatal(err)
	}
	if dropped != 1 {
		t.Errorf("dropped %d blobs, want 1", dropped)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if h.Name == "blobs/sha256/bbbb" && string(body) != "refdp's layer" {
			t.Errorf("%s holds %q, want it unchanged", h.Name, body)
		}
		names = append(names, h.Name)
	}
	want := []string{"blobs/", "blobs/sha256/", "blobs/sha256/bbbb", "index.json", "manifest.json"}
	if !slices.Equal(names, want) {
		t.Errorf("archive holds %v, want %v", names, want)
	}

	if _, _, err := withoutBlobs([]byte("not a tar archive, and long enough to be read as a header block........................................................................................................................................................................................................................................................................................................................................................................................................................................................................"), nil); err == nil {
		t.Error("a malformed archive: no error")
	}
}
