package gateway

// RLSCalls returns how many Envoy RLS listener calls s answered on their
// connection's reading goroutine and how many it handed off.
func RLSCalls(s *Server) (inline, async uint64) {
	if s.grpc == nil {
		return 0, 0
	}
	return s.grpc.srv.Calls()
}
