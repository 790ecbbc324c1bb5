package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/tollgate/tollgate/aggregator/internal/reports"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// errNATSDown is a region asked while this instance has no NATS
// connection.
var errNATSDown = errors.New("aggregator: NATS not connected")

// regionsConfig is the global reports' configuration: this region, the
// rules' regions list, and other regions asked over NATS.
func (s *Server) regionsConfig() reports.RegionsConfig {
	return reports.RegionsConfig{Region: s.cfg.Region, Regions: s.regionNames, Ask: s.askRegion, MaxRows: s.cfg.Usage.MaxRows}
}

// regionNames returns the names of the active rules' regions list (none
// without a list).
func (s *Server) regionNames(ctx context.Context) ([]string, error) {
	g, err := s.keyGuard(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, r := range g.Rules().Regions() {
		names = append(names, r.Name)
	}
	return names, nil
}

// askRegion asks region's aggregators for a report over NATS.
func (s *Server) askRegion(ctx context.Context, region string, req reports.RegionRequest) (reports.RegionReply, error) {
	nc := s.nc.Load()
	if nc == nil {
		return reports.RegionReply{}, errNATSDown
	}
	b, err := json.Marshal(req)
	if err != nil {
		return reports.RegionReply{}, fmt.Errorf("aggregator: encode report request: %w", err)
	}
	out, err := nc.RequestReply(ctx, tollgatev1.SubjectRegionUsage(region), b)
	if err != nil {
		return reports.RegionReply{}, err
	}
	var rep reports.RegionReply
	if err := json.Unmarshal(out, &rep); err != nil {
		return reports.RegionReply{}, fmt.Errorf("aggregator: region %s's reply: %w", region, err)
	}
	return rep, nil
}

// serveRegionReports answers other regions' global reports with this
// region's own report until ctx is done: 503 while the state is being
// restored (the asking region then names this one as missing).
func (s *Server) serveRegionReports(ctx context.Context, nc *fleetkv.Conn) error {
	maxBytes := nc.MaxPayload() - 4<<10
	return nc.ServeRequests(ctx, tollgatev1.SubjectRegionUsage(s.cfg.Region), tollgatev1.QueueRegionUsage,
		func(ctx context.Context, data []byte) []byte {
			var rep reports.RegionReply
			var req reports.RegionRequest
			switch err := json.Unmarshal(data, &req); {
			case err != nil:
				rep = reports.ErrorReply(http.StatusBadRequest, apierror.InvalidRequest, "not a report request")
			case !s.proc.Ready():
				rep = reports.ErrorReply(http.StatusServiceUnavailable, apierror.StateRestoring, "the state is being restored")
			default:
				rep = reports.ServeLocal(ctx, s.reportsMux, req, maxBytes)
			}
			b, err := json.Marshal(rep)
			if err != nil {
				s.log.Warn("encoding a region report failed", slog.String("error", err.Error()))
			}
			return b
		})
}

// RegionReportTimeout bounds how long a global report waits for the other
// regions.
const RegionReportTimeout = reports.DefaultRegionTimeout
