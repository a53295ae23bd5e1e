package bench

import (
	"strings"
	"testing"
)

// TestWriteImports renders scenario 6: medians per method, failures named,
// times relative to the import.
func TestWriteImports(t *testing.T) {
	res := &Results{Config: Config{ImportImageBytes: 128 << 20}}
	for rep, secs := range []float64{1, 2, 3} {
		res.Imports = append(res.Imports,
			ImportRow{Layers: 50, Rep: rep, Method: methodImport, Seconds: secs, BytesWritten: 10 << 20},
			ImportRow{Layers: 50, Rep: rep, Method: methodLocal, Seconds: 4 * secs, BytesWritten: 100 << 20},
		)
	}
	res.Imports = append(res.Imports, ImportRow{Layers: 50, Rep: 0, Method: methodPull, Err: "registry down"})
	var b strings.Builder
	writeImports(&b, res)
	out := b.String()
	for _, want := range []string{
		"| 50 | " + methodImport + " | 2.00 (1.00–3.00) | 10.0 MiB | 1.00× |",
		"| 50 | " + methodLocal + " | 8.00 (4.00–12.00) | 100.0 MiB | 4.00× |",
		"(1 failed: `registry down`)",
		"128.0 MiB of files",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scenario 6 table lacks %q:\n%s", want, out)
		}
	}
	var empty strings.Builder
	writeImports(&empty, &Results{})
	if empty.Len() != 0 {
		t.Errorf("no import rows rendered %q, want nothing", empty.String())
	}
}
