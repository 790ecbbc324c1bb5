package regionsim

// floorDiv is a ÷ b rounded towards minus infinity (b > 0): the window
// that a time falls in.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
