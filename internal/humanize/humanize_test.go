package humanize

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{1536 << 20: "1.5GiB", 544: "544B", -2048: "-2.0KiB", 0: "0B", 3 << 40: "3.0TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
