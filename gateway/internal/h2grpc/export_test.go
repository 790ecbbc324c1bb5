package h2grpc

// WorkersStarted returns how many goroutines the server started for calls
// that had to wait.
func (s *Server) WorkersStarted() uint64 { return s.started.Load() }
