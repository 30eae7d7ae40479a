package cuda

import "strconv"

// formatSize renders a byte count for error messages: "1048576 bytes (1 MiB)".
func formatSize(n uint64) string {
	s := strconv.FormatUint(n, 10) + " bytes"
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, u := float64(n), -1
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if u >= 0 {
		s += " (" + strconv.FormatFloat(v, 'g', 4, 64) + " " + units[u] + ")"
	}
	return s
}
