package events

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// metaVersion is the version of the producer's blob in the spool's META.
const metaVersion = 1

// meta is what the producer keeps in its spool's META blob (JSON): its
// current epoch with the sequence numbers reserved on each partition, and
// the earlier epochs whose EpochClosed markers are not yet durable (in the
// spool or acknowledged by Kafka).
type meta struct {
	Version   int    `json:"version"`
	GatewayID string `json:"gateway_id"`
	Epoch     uint64 `json:"epoch"`
	// Partitions is the topic's partition count the epoch numbers by; a
	// restart with Kafka down starts the next epoch with it.
	Partitions int32 `json:"partitions"`
	// Reserved[p] is the last sequence number reserved on partition p: no
	// event of the epoch uses a larger one unless the producer overran its
	// reservation (counted in tollgate_events_reservation_overruns_total).
	// A graceful stop lowers it to the last number used.
	Reserved []uint64 `json:"reserved"`
	// Closing lists earlier epochs still to be closed.
	Closing []epochState `json:"closing,omitempty"`
}

// epochState is an epoch to close: the markers name Reserved[p] on each
// partition p whose Reserved is not 0.
type epochState struct {
	GatewayID string   `json:"gateway_id"`
	Epoch     uint64   `json:"epoch"`
	Reserved  []uint64 `json:"reserved"`
}

func decodeMeta(blob []byte) (meta, error) {
	var m meta
	if err := json.Unmarshal(blob, &m); err != nil {
		return meta{}, fmt.Errorf("events: decode spool metadata: %w", err)
	}
	if m.Version != metaVersion {
		return meta{}, fmt.Errorf("events: decode spool metadata: %w: version %d, this build reads %d",
			ErrMetaVersion, m.Version, metaVersion)
	}
	return m, nil
}

func (m *meta) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("events: encode spool metadata: %w", err)
	}
	return b, nil
}

// toClose is the list of epochs a new epoch must close: the ones m was
// still closing and m's own.
func (m *meta) toClose() []epochState {
	out := append([]epochState(nil), m.Closing...)
	if m.Epoch != 0 {
		out = append(out, epochState{GatewayID: m.GatewayID, Epoch: m.Epoch, Reserved: m.Reserved})
	}
	return out
}

// newEpoch draws a random, non-zero boot epoch different from every epoch
// in avoid.
func newEpoch(avoid []epochState) (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("events: draw boot epoch: %w", err)
		}
		e := binary.LittleEndian.Uint64(b[:])
		if e == 0 {
			continue
		}
		clash := false
		for _, c := range avoid {
			clash = clash || c.Epoch == e
		}
		if !clash {
			return e, nil
		}
	}
}
