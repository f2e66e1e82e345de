//! Why the engine refused a received packet: every drop is counted under
//! a named reason, per device ([`super::Stats::drops`]) and per QP
//! ([`super::QpSnapshot::drops`]), and logged at `trace` level with its
//! QP.

/// A reason a received packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum DropReason {
    /// Not a well-formed RoCEv2 packet (or IP/UDP header).
    Malformed,
    /// ICRC mismatch.
    BadIcrc,
    /// No QP with that number.
    NoQp,
    /// The QP's transport does not match the opcode's.
    WrongTransport,
    /// The QP is in a state that does not receive (RESET, INIT, ERR...), or
    /// a response reached a QP that is not sending.
    WrongState,
    /// From an address that is not the connected QP's peer.
    WrongPeer,
    /// A request PSN past the expected one (RC: a sequence NAK was sent
    /// once; UC: the message is dropped).
    PsnGap,
    /// A response whose PSN is outside the requests in flight (late or
    /// duplicate).
    PsnOutOfWindow,
    /// A duplicate READ/atomic request with nothing to replay.
    DuplicateUnanswerable,
    /// An opcode out of sequence, or a response of the wrong kind for the
    /// request it names.
    OpcodeSequence,
    /// A request refused by the responder's checks (UC: access, length,
    /// invalid request; RC sends a NAK and counts that separately).
    Refused,
    /// No receive posted (RC: an RNR NAK was sent; UD/UC: dropped).
    NoReceive,
    /// UD: the Q_Key does not match.
    BadQkey,
    /// To QP1: not a CM MAD this device serves.
    NotCm,
    /// An engine invariant failed while handling it (a bug; debug builds
    /// panic instead).
    Internal,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 15] = [
        DropReason::Malformed,
        DropReason::BadIcrc,
        DropReason::NoQp,
        DropReason::WrongTransport,
        DropReason::WrongState,
        DropReason::WrongPeer,
        DropReason::PsnGap,
        DropReason::PsnOutOfWindow,
        DropReason::DuplicateUnanswerable,
        DropReason::OpcodeSequence,
        DropReason::Refused,
        DropReason::NoReceive,
        DropReason::BadQkey,
        DropReason::NotCm,
        DropReason::Internal,
    ];

    /// A short name (`roxe stat`, logs).
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadIcrc => "bad_icrc",
            DropReason::NoQp => "no_qp",
            DropReason::WrongTransport => "wrong_transport",
            DropReason::WrongState => "wrong_state",
            DropReason::WrongPeer => "wrong_peer",
            DropReason::PsnGap => "psn_gap",
            DropReason::PsnOutOfWindow => "psn_out_of_window",
            DropReason::DuplicateUnanswerable => "duplicate_unanswerable",
            DropReason::OpcodeSequence => "opcode_sequence",
            DropReason::Refused => "refused",
            DropReason::NoReceive => "no_receive",
            DropReason::BadQkey => "bad_qkey",
            DropReason::NotCm => "not_cm",
            DropReason::Internal => "internal",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Drop counters by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts([u64; DropReason::ALL.len()]);

impl DropCounts {
    /// Count one.
    pub fn add(&mut self, r: DropReason) {
        self.0[r as usize] += 1;
    }
    /// The count of `r`.
    pub fn get(&self, r: DropReason) -> u64 {
        self.0[r as usize]
    }
    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// The reasons with a non-zero count, with their counts.
    pub fn nonzero(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|&r| (r, self.get(r)))
            .filter(|&(_, n)| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_index_their_counters() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r}");
        }
        let mut c = DropCounts::default();
        c.add(DropReason::BadQkey);
        c.add(DropReason::BadQkey);
        c.add(DropReason::NoQp);
        assert_eq!(c.get(DropReason::BadQkey), 2);
        assert_eq!(c.total(), 3);
        assert_eq!(
            c.nonzero().collect::<Vec<_>>(),
            [(DropReason::NoQp, 1), (DropReason::BadQkey, 2)]
        );
    }
}
